//! `perago-operator`: the PeragoTask operator and its offline tools (`perago_operator::app`).

use std::process::ExitCode;

use clap::Parser;

use perago_operator::app::{Args, execute};

fn main() -> ExitCode {
    // clap exits with status 2 on usage errors, as the CLI contract requires.
    match execute(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}
