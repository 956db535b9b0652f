//! Replays every saved input under `regressions/<target>/` (crashes found by fuzzing, minimised)
//! and `seeds/<target>/` through its harness, on stable and without libFuzzer:
//! `cargo test --manifest-path fuzz/Cargo.toml`.

use std::path::Path;

#[test]
fn saved_inputs_pass() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut ran = 0;
    for dir in ["regressions", "seeds"] {
        for target in numaframe_fuzz::TARGETS {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
                continue;
            };
            let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            paths.sort();
            for path in paths {
                let data = std::fs::read(&path).unwrap();
                eprintln!("{}", path.display());
                assert!(numaframe_fuzz::run(target, &data));
                ran += 1;
            }
        }
    }
    assert!(ran > 0, "no saved inputs found");
}
