fn main() -> std::process::ExitCode {
    zuno_cli::main(std::sync::Arc::new(zuno_api::Api))
}
