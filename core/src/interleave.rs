//! Weighted interleave (placeholder, being written).
#![deny(unsafe_code)]
