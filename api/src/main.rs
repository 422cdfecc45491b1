fn main() -> std::process::ExitCode {
    zuno_api::cli::main()
}
