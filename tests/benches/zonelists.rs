//! A full fallback-order rebuild, numaframe's one sort per node (O(N² log N)) side by side with
//! Linux's scan transcribed plainly (O(N³), `numaframe_tests::oracle`), on machines laid out
//! like real ones: packages of 16 nodes (10 local, 12 within a package, 20 to the other package
//! of the board, 32 beyond), a quarter of each package CPU-less, a few nodes memoryless.
//!
//! `cargo bench -p numaframe-tests --bench zonelists`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use numaframe::zonelist::{FallbackOptions, build_fallback};
use numaframe::{NodeId, Topology};
use numaframe_testkit::{FallbackParts, FallbackStorage, node_infos, node_states};
use numaframe_tests::oracle::build_all_zonelists;
use numaframe_tests::topologies;

fn rebuild(c: &mut Criterion) {
    for sockets in [16, 64] {
        let t = topologies::sockets(sockets, 16);
        let n = t.len();
        let infos = node_infos(&t.has_cpus, &t.has_memory);
        let topo = Topology::new(&t.distances, &infos).expect("valid topology");
        let states = node_states(&topo);
        let opts = FallbackOptions::default();
        // The machine's storage, allocated once as a booted machine holds it.
        let mut storage = FallbackStorage::new(n);
        let FallbackParts {
            mut table,
            mut scratch,
        } = storage.parts();

        // Both sides do the same work: check once that they agree.
        build_fallback(&topo, &states, opts, &mut scratch, &mut table);
        let oracle = build_all_zonelists(&t, false);
        for (i, row) in oracle.iter().enumerate() {
            let got: Vec<usize> = table
                .order(NodeId::new(i))
                .iter()
                .map(|x| x.index())
                .collect();
            assert_eq!(
                &got, row,
                "node {i}: build_fallback disagrees with the oracle"
            );
        }

        let mut group = c.benchmark_group(format!("full-rebuild/{n}-nodes"));
        group
            .sample_size(10)
            .sampling_mode(SamplingMode::Flat)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        group.bench_function("numaframe build_fallback (one sort per node)", |b| {
            b.iter(|| {
                build_fallback(
                    black_box(&topo),
                    black_box(&states),
                    opts,
                    &mut scratch,
                    &mut table,
                );
                black_box(table.order(NodeId::new(n - 1)).len())
            })
        });
        // About 1e9 steps (over a second) at 1024 nodes: give criterion's minimum of 10 samples
        // the time they take.
        group.measurement_time(Duration::from_secs(if n >= 1024 { 14 } else { 2 }));
        group.bench_function("linux build_zonelists scan (O(N^3) oracle)", |b| {
            b.iter(|| build_all_zonelists(black_box(&t), false))
        });
        group.finish();
    }
}

criterion_group!(benches, rebuild);
criterion_main!(benches);
