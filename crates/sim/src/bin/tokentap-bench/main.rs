//! `tokentap-bench`: the load generator behind `scripts/bench.sh`.
//!
//! It opens N concurrent streaming chat requests against a target (the simulator directly,
//! tokentap, nginx or Envoy in front of it), one HTTP/1.1 keep-alive connection per
//! concurrent stream (or N streams multiplexed over a few h2c connections), and measures
//! per *event*, not per request: the simulator started with `--stamp` embeds its wall-clock
//! send time (`"sim_sent_unix_ns"`) in every SSE chunk, and the bench subtracts it from the
//! wall-clock arrival of the frame that completed the event. The same figure measured
//! directly against the simulator is the baseline; a proxy's added latency is the
//! difference.
//!
//! Subcommands:
//! - `run`: stream load for a duration or a request count, or (`--hold`) open N streams
//!   and keep them open; prints one JSON summary line on stdout.
//! - `fidelity`: pair the per-request client log of a `run --requests-log` with tokentap's
//!   JSON access log (by the unique `x-tenant-id` each request carried) and report how far
//!   tokentap's TTFT / mean ITL are from what the client saw, and token-count mismatches.
//!   It also reports how far the simulator's own TTFT (its stamps: first token sent minus
//!   request received) is from the client's; from a run straight at the simulator (no
//!   `--access`), that is the floor any observer between them can reach on the machine.
//! - `scrape`: time full `GET`s of a URL (the admin `/metrics`), median of repeats.

mod cli;
mod fidelity;
mod hist;
mod load;
mod scrape;

use anyhow::Context;
use clap::Parser;

use cli::{Cli, Command};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => load::run(args),
        Command::Fidelity(args) => fidelity::fidelity(&args),
        Command::Scrape(args) => scrape::scrape(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("tokentap-bench: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let rt = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    };
    rt.context("cannot start the async runtime")
}
