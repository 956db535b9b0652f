//! Boot events through defmt (feature `defmt`): a `#[defmt::global_logger]` that writes the
//! encoded frames to a host file, `defmt.bin` in QEMU's working directory, through Arm
//! semihosting. QEMU must run with `-semihosting-config enable=on,target=native`; the host
//! decodes the file with the ELF's `.defmt` table (`defmt-print -e ELF < defmt.bin`, or the
//! `defmt-decoder` library as the QEMU test does).
//!
//! The events use the core's `defmt::Format` impls (`NodeId`, `PhysRange`, `HugeSize`,
//! `Weights`, the error types), so this build is what exercises numaframe's `defmt` feature.
//! Without semihosting the `hlt` would trap, so nothing is logged unless [`init`] is called.

use core::arch::asm;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, Ordering};

use numaframe::HugeSize;
use numaframe::{Machine, MemoryRange, NodeId};

const SYS_OPEN: u64 = 0x01;
const SYS_WRITE: u64 = 0x05;
/// `fopen` mode "wb".
const MODE_WB: u64 = 5;
const FILE: &[u8] = b"defmt.bin\0";

/// An Arm semihosting call (AArch64: `hlt #0xf000`, operation in w0, parameter block in x1).
///
/// # Safety
/// The debugger or emulator must implement semihosting (QEMU with semihosting enabled), and
/// `block` must point to the parameter block `op` expects.
unsafe fn semihost(op: u64, block: &[u64]) -> i64 {
    let ret: i64;
    // SAFETY: the caller guarantees semihosting is on; the host reads `block` (and what it
    // points to) and writes only x0.
    unsafe {
        asm!("hlt #0xf000", inout("x0") op => ret, in("x1") block.as_ptr(), options(nostack))
    };
    ret
}

/// The bytes waiting for the host, and the host file.
struct Out {
    buf: [u8; 512],
    len: usize,
    /// The host file, or -1 when logging is off.
    handle: i64,
}

impl Out {
    fn flush(&mut self) {
        if self.handle >= 0 && self.len > 0 {
            let block = [
                self.handle as u64,
                self.buf.as_ptr().addr() as u64,
                self.len as u64,
            ];
            // SAFETY: `init` found semihosting working (it opened the file); the block names
            // the file and `len` initialised bytes of `buf`.
            unsafe { semihost(SYS_WRITE, &block) };
        }
        self.len = 0;
    }

    fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.len == self.buf.len() {
                self.flush();
            }
            self.buf[self.len] = b;
            self.len += 1;
        }
    }
}

/// A value that only the holder of `TAKEN` touches.
struct Exclusive<T>(UnsafeCell<T>);

// SAFETY: every access goes through `Exclusive::with`, whose callers hold `TAKEN`, so at most
// one reference exists at a time.
unsafe impl<T> Sync for Exclusive<T> {}

impl<T> Exclusive<T> {
    /// Runs `f` on the value. The caller holds `TAKEN` and does not nest calls on the same
    /// value.
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        // SAFETY: `TAKEN` is held and calls on one value never nest (the encoder's callback
        // reaches `OUT`, a different value), so this is the only reference.
        f(unsafe { &mut *self.0.get() })
    }
}

static ENCODER: Exclusive<defmt::Encoder> = Exclusive(UnsafeCell::new(defmt::Encoder::new()));
static OUT: Exclusive<Out> = Exclusive(UnsafeCell::new(Out {
    buf: [0; 512],
    len: 0,
    handle: -1,
}));
static TAKEN: AtomicBool = AtomicBool::new(false);

fn emit(bytes: &[u8]) {
    OUT.with(|o| o.push(bytes));
}

/// Opens `defmt.bin` on the host. Call once, early, and only under QEMU with semihosting.
pub fn init() {
    if TAKEN.swap(true, Ordering::Acquire) {
        return;
    }
    let block = [
        FILE.as_ptr().addr() as u64,
        MODE_WB,
        (FILE.len() - 1) as u64,
    ];
    // SAFETY: this build is documented to run with semihosting on; the block names a
    // NUL-terminated file name and its length.
    let handle = unsafe { semihost(SYS_OPEN, &block) };
    OUT.with(|o| o.handle = handle);
    TAKEN.store(false, Ordering::Release);
}

#[defmt::global_logger]
struct Logger;

// SAFETY: acquire/release bracket every frame and exclude each other through `TAKEN`; `write`
// and `flush` run only between them, as defmt guarantees.
unsafe impl defmt::Logger for Logger {
    fn acquire() {
        while TAKEN.swap(true, Ordering::Acquire) {
            core::hint::spin_loop();
        }
        ENCODER.with(|e| e.start_frame(emit));
    }

    unsafe fn flush() {
        OUT.with(Out::flush);
    }

    unsafe fn release() {
        ENCODER.with(|e| e.end_frame(emit));
        OUT.with(Out::flush);
        TAKEN.store(false, Ordering::Release);
    }

    unsafe fn write(bytes: &[u8]) {
        ENCODER.with(|e| e.write(bytes, emit));
    }
}

/// Logs the machine numaframe booted: memory per node and every fallback order.
pub fn booted(machine: &Machine<'_>, ranges: &[MemoryRange]) {
    defmt::println!(
        "numaframe booted: {=usize} nodes, {=usize} memory ranges",
        machine.topology().len(),
        ranges.len()
    );
    for r in ranges {
        defmt::println!("node {} owns {}", r.node, r.range);
    }
    let mut order = [NodeId::new(0); crate::boot::MAX_NODES];
    for node in machine.topology().node_ids() {
        let n = machine.fallback_order(node, &mut order);
        defmt::println!("fallback order for node {}: {}", node, &order[..n]);
    }
}

/// Logs the huge-page pools per node.
pub fn hugepages(machine: &Machine<'_>) {
    for node in machine.topology().node_ids() {
        for size in HugeSize::ALL {
            let total = machine.huge_counts(node, size).total;
            if total > 0 {
                defmt::println!("node {} holds {=u64} pages of {}", node, total, size);
            }
        }
    }
    defmt::println!("weights {}", machine.weights());
}

/// Logs the end of the run.
pub fn done() {
    defmt::println!("all checks passed, powering off");
}
