fn main() -> std::process::ExitCode {
    burnlens_cli::run()
}
