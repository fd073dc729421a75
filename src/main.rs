//! The `seglog` binary: parse arguments, run the command, map the result to an exit code.

fn main() -> std::process::ExitCode {
    seglog::cmd::main()
}
