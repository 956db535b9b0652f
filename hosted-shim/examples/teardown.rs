//! Runs the `numaframe bench` scenario "guest teardown + zeroed reallocation" on its own, for a
//! measurement on a machine that runs nothing else meanwhile (the whole bench takes minutes, and
//! its other scenarios load the machine between this one's passes).
//!
//! `cargo run --release -p numaframe-hosted --example teardown [GIB]` (default 16): a guest of
//! `GIB` GiB torn down and reallocated zeroed three ways (inline clearing, a background scrub
//! first, no zeroing), with a `memset` of the same memory as the yardstick; prints the result
//! as JSON, the fields the bench's JSON gives this scenario.
#![deny(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;

use numaframe::PAGE_SIZE;
use numaframe_hosted::bench::teardown;

fn main() -> ExitCode {
    let gib = match std::env::args().nth(1).map(|a| a.parse::<u64>()) {
        None => 16,
        Some(Ok(g)) if (1..=1024).contains(&g) => g,
        Some(_) => {
            eprintln!("error: usage: teardown [GIB], GIB a whole number from 1 to 1024");
            return ExitCode::from(2);
        }
    };
    match teardown::run((gib << 30) / PAGE_SIZE) {
        Ok(t) => match serde_json::to_string_pretty(&t) {
            Ok(json) => match writeln!(std::io::stdout(), "{json}") {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: writing the result: {e}");
                    ExitCode::FAILURE
                }
            },
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
