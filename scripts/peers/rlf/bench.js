// The rate-limiter-flexible peer of tollgate's load tool: RateLimiterRedis
// over ioredis, called as its docs say (`consume(key)`), from N concurrent
// async loops on one ioredis connection, for a duration. Prints a line
// scripts/bench-peers.sh sums over runs:
//
//   result path=rlf decisions=<n> seconds=<wall> server_cpu=<s> errors=<n>
//
// A refusal (a rejected promise with a RateLimiterRes) is a decision, as in
// the load tool; an Error is an error.
//
//   node bench.js --url redis://127.0.0.1:6379 --concurrency 50 \
//       --keys 10000 --duration 4 [--rounds 1] [--autopipelining 1]
//
// --autopipelining 1 turns on ioredis's enableAutoPipelining (off by
// default, as in rate-limiter-flexible's docs): the commands issued in one
// tick of the event loop go out in one write, as a redis-rs multiplexed
// connection batches the Rust paths' concurrent calls. Without it every
// decision is a write of its own, which costs redis-server more CPU a
// decision (docs/benchmarks.md, "rate-limiter-flexible and pipelining").
//
// Concurrency: a loop awaits one decision at a time, like a task of the load
// tool, so N loops keep at most N decisions in flight on the connection.
// Node runs them all on one thread; the load tool's tasks run on its tokio
// workers (2 by default).
'use strict';

const Redis = require('ioredis');
const { RateLimiterRedis, RateLimiterRes } = require('rate-limiter-flexible');

function parseArgs(argv) {
  const args = {
    url: 'redis://127.0.0.1:6379',
    concurrency: 50,
    keys: 10000,
    duration: 4,
    rounds: 1,
    autopipelining: 0,
  };
  for (let i = 2; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, '');
    if (!(name in args)) throw new Error(`unknown option ${argv[i]}`);
    args[name] = name === 'url' ? argv[i + 1] : Number(argv[i + 1]);
    if (name !== 'url' && !(args[name] > 0)) throw new Error(`--${name} must be a positive number`);
  }
  const host = new URL(args.url).hostname;
  if (!(host === 'localhost' || host.startsWith('127.') || host === '[::1]')) {
    console.error(`refusing ${args.url}: loopback servers only`);
    process.exit(2);
  }
  if (args.duration > 60) throw new Error('--duration is at most 60 (seconds)');
  return args;
}

// redis-server's CPU time so far (user + system), in seconds.
async function serverCpu(probe) {
  const info = await probe.info('cpu');
  let total = 0;
  for (const line of info.split('\n')) {
    const [name, value] = line.trim().split(':');
    if (name === 'used_cpu_user' || name === 'used_cpu_sys') total += Number(value);
  }
  return total;
}

async function drive(limiter, names, concurrency, seconds) {
  const deadline = performance.now() + seconds * 1000;
  let decisions = 0;
  let errors = 0;
  const loop = async () => {
    while (performance.now() < deadline) {
      const key = names.length === 1 ? names[0] : names[Math.floor(Math.random() * names.length)];
      try {
        await limiter.consume(key);
        decisions += 1;
      } catch (e) {
        if (e instanceof RateLimiterRes) decisions += 1;
        else errors += 1;
      }
    }
  };
  const start = performance.now();
  await Promise.all(Array.from({ length: concurrency }, loop));
  return { decisions, errors, seconds: (performance.now() - start) / 1000 };
}

async function main() {
  const args = parseArgs(process.argv);
  const redis = new Redis(args.url, {
    enableOfflineQueue: true,
    enableAutoPipelining: args.autopipelining === 1,
  });
  const probe = new Redis(args.url);
  // The same bucket size as the load tool's token bucket (1000, 1000/s),
  // in rate-limiter-flexible's terms: 1000 points per 1 s window.
  const limiter = new RateLimiterRedis({
    storeClient: redis,
    keyPrefix: 'bench-rlf',
    points: 1000,
    duration: 1,
  });
  const names = Array.from({ length: Math.max(1, args.keys) }, (_, i) => `client-${i}`);
  await drive(limiter, names, args.concurrency, 0.2); // warm-up: connection, script
  const total = { decisions: 0, errors: 0, seconds: 0, cpu: 0 };
  for (let r = 0; r < args.rounds; r++) {
    const before = await serverCpu(probe);
    const s = await drive(limiter, names, args.concurrency, args.duration / args.rounds);
    total.cpu += (await serverCpu(probe)) - before;
    total.decisions += s.decisions;
    total.errors += s.errors;
    total.seconds += s.seconds;
  }
  const rate = total.decisions / total.seconds;
  console.log(
    `rlf      ${rate.toFixed(0).padStart(10)} decisions/s   errors ${total.errors}   ` +
      `${(total.decisions / total.cpu).toFixed(0)} decisions per server-CPU second`,
  );
  console.log(
    `result path=rlf decisions=${total.decisions} seconds=${total.seconds.toFixed(6)} ` +
      `server_cpu=${total.cpu.toFixed(6)} errors=${total.errors}`,
  );
  redis.disconnect();
  probe.disconnect();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
