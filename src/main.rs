use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = gpuslice::cli::Cli::parse();
    gpuslice::cli::init_tracing(cli.log_json);
    if matches!(cli.command, gpuslice::cli::Command::Exec { .. }) {
        // No runtime: `exec` replaces or forks this process.
        return match gpuslice::cli::exec_command(&cli) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
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
