//! The `tollgate` binary: see the `tollgate_cli` crate.

fn main() -> std::process::ExitCode {
    tollgate_cli::main()
}
