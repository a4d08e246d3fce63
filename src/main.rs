use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = gpuslice::cli::Cli::parse();
    gpuslice::cli::init_tracing(cli.log_json);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(gpuslice::cli::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
