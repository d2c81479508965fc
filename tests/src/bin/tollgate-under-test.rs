//! The `tollgate` CLI, built in this package for its tests.

fn main() -> std::process::ExitCode {
    tollgate_cli::main()
}
