//! Huge-page pools (placeholder, being written).
#![deny(unsafe_code)]
pub mod cmdline;
