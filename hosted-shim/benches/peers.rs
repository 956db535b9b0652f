//! numaframe side by side with buddy_system_allocator, bitmap-allocator, free-list and a
//! `Vec<u64>` floor, under criterion: the scenarios of `numaframe bench`
//! (`numaframe_hosted::bench`, shared code), one criterion group per group of cells, one
//! benchmark per (scenario, allocator). Throughput is set to the operations of one iteration
//! (pairs, frames, allocations + frees, pages, boots), so criterion's elements/s is ops/s.
//!
//! `cargo bench -p numaframe-hosted --bench peers` (add `-- --quick` for a short run, or a
//! filter such as `-- pair`). free-list's fill+random-free over 1 GiB takes seconds per
//! iteration (its free is O(free ranges)); it runs only with `NUMAFRAME_BENCH_SLOW=1`.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use numaframe_hosted::bench::{Group, Sizes, Visitor, visit};

struct CriterionVisitor<'c> {
    c: &'c mut Criterion,
    slow: bool,
}

impl Visitor for CriterionVisitor<'_> {
    fn group(&mut self, group: Group<'_>) -> std::io::Result<()> {
        let mut g = self.c.benchmark_group(group.title);
        if group.heavy {
            g.sample_size(10)
                .sampling_mode(SamplingMode::Flat)
                .warm_up_time(Duration::from_millis(100))
                .measurement_time(Duration::from_secs(2));
        } else {
            g.sample_size(30)
                .warm_up_time(Duration::from_millis(300))
                .measurement_time(Duration::from_secs(2));
        }
        for mut cell in group.cells {
            if cell.slow && !self.slow {
                eprintln!(
                    "{}/{}/{}: skipped (seconds per iteration; NUMAFRAME_BENCH_SLOW=1 runs it)",
                    group.title, cell.scenario, cell.allocator
                );
                continue;
            }
            g.throughput(Throughput::Elements(cell.ops_per_iter));
            g.bench_function(BenchmarkId::new(cell.scenario, cell.allocator), |b| {
                b.iter_custom(|iters| (cell.run)(iters).time)
            });
        }
        g.finish();
        Ok(())
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let slow = std::env::var_os("NUMAFRAME_BENCH_SLOW").is_some_and(|v| v == "1");
    let mut v = CriterionVisitor { c: &mut c, slow };
    visit(Sizes::FULL, &mut v).expect("benchmark machines");
    c.final_summary();
}
