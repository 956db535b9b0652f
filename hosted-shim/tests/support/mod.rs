//! Helpers shared by the CLI tests: run the binary, expect a bad-input exit. (Temp files are the
//! test kit's `TempDir`.)
// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

use std::process::Command;

/// Runs the binary; returns (exit status, stdout, stderr). Fails the test on a signal.
pub fn numaframe(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_numaframe"))
        .args(args)
        .output()
        .expect("run numaframe");
    let code = out
        .status
        .code()
        .unwrap_or_else(|| panic!("{args:?}: killed by a signal ({:?})", out.status));
    (
        code,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Asserts exit 2, nothing on stdout and exactly one `error:` line containing `want`.
pub fn bad_input(args: &[&str], want: &str) {
    let (code, out, err) = numaframe(args);
    assert_eq!(code, 2, "{args:?}: stderr {err:?}");
    assert!(out.is_empty(), "{args:?}: stdout {out:?}");
    assert_eq!(err.lines().count(), 1, "{args:?}: stderr {err:?}");
    assert!(
        err.starts_with("error: ") && err.ends_with('\n'),
        "{args:?}: stderr {err:?}"
    );
    assert!(
        err.contains(want),
        "{args:?}: stderr {err:?}, want {want:?}"
    );
}
