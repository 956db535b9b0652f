//! The allocator's own memory ([`Machine::metadata_bytes`]) as `demo`, `hugepages` and `frag`
//! print it: in bytes and per GiB of the memory the machine manages.
#![deny(unsafe_code)]

use numaframe::{Machine, PAGE_SIZE};
use serde::Serialize;

const GIB: f64 = (1u64 << 30) as f64;

/// The metadata of a machine at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Metadata {
    /// Bytes of the allocator's own memory.
    pub bytes: u64,
    /// Bytes the machine manages (free or handed out).
    pub managed_bytes: u64,
    /// `bytes` per GiB of `managed_bytes` (0 when nothing is managed).
    pub bytes_per_gib: f64,
}

impl Metadata {
    /// `machine`'s metadata now.
    pub fn of(machine: &Machine<'_>) -> Metadata {
        let bytes = machine.metadata_bytes();
        let managed_bytes = machine
            .nodes()
            .iter()
            .map(|n| n.managed_pages())
            .sum::<u64>()
            * PAGE_SIZE;
        let bytes_per_gib = if managed_bytes == 0 {
            0.0
        } else {
            bytes as f64 / (managed_bytes as f64 / GIB)
        };
        Metadata {
            bytes,
            managed_bytes,
            bytes_per_gib,
        }
    }
}

impl std::fmt::Display for Metadata {
    /// `1234567 bytes (1.18 MiB), 18.84 KiB per GiB of 64.00 GiB managed`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes ({}), {} per GiB of {} managed",
            self.bytes,
            human(self.bytes as f64),
            human(self.bytes_per_gib),
            human(self.managed_bytes as f64)
        )
    }
}

/// Bytes in the largest binary unit that keeps the number at 1 or more, two decimals.
fn human(bytes: f64) -> String {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.2} {}", units[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human(0.0), "0.00 bytes");
        assert_eq!(human(1023.0), "1023.00 bytes");
        assert_eq!(human(1536.0), "1.50 KiB");
        assert_eq!(human(3.0 * GIB), "3.00 GiB");
        assert_eq!(human(2048.0 * 1024.0 * GIB), "2048.00 TiB");
        let m = Metadata {
            bytes: 1 << 20,
            managed_bytes: 4 << 30,
            bytes_per_gib: 262_144.0,
        };
        assert_eq!(
            m.to_string(),
            "1048576 bytes (1.00 MiB), 256.00 KiB per GiB of 4.00 GiB managed"
        );
    }
}
