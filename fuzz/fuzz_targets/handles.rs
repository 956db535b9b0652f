#![no_main]
//! See `numaframe_fuzz::ops` for what this target checks.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| numaframe_fuzz::ops::run_handles(data));
