//! The `numaframe` command; everything but the exit lives in [`numaframe_hosted::cli`].

fn main() {
    std::process::exit(numaframe_hosted::cli::main());
}
