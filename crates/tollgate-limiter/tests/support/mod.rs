//! What the metrics tests share (`mod support;` in each test binary).

use std::future::Future;

use metrics_util::debugging::{DebuggingRecorder, Snapshotter};

/// Runs `test` on a paused current-thread runtime with a recording
/// recorder (limiters must be built inside: they register their handles
/// when built), handing it the snapshotter.
pub(crate) fn recorded<F: Future<Output = ()>>(test: impl FnOnce(Snapshotter) -> F) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    ::metrics::with_local_recorder(&recorder, || rt.block_on(test(snapshotter)));
}
