//! The boot CPU's local APIC in xAPIC mode: where its registers are, and the interrupt command
//! register that sends the INIT and STARTUP IPIs which start the other CPUs.
//!
//! The registers are memory-mapped at the base `IA32_APIC_BASE` names, identity-mapped by the
//! boot map and then, uncached, by the kernel's tables (`paging`). x2APIC mode (the registers as
//! MSRs) is not used: QEMU's TCG before 8.1 has no x2APIC, and firmware that switched the boot
//! CPU to it is refused, as are destinations above 255, which xAPIC's ICR cannot name.

use core::ptr;

use super::{cpu, entry};

/// `IA32_APIC_BASE` bits: the APIC is enabled, and it is in x2APIC mode.
const BASE_ENABLED: u64 = 1 << 11;
const BASE_X2APIC: u64 = 1 << 10;
/// The interrupt command register, low and high words.
const ICR_LOW: usize = 0x300;
const ICR_HIGH: usize = 0x310;
/// ICR low: delivery modes INIT and STARTUP, level assert, and the send-pending status.
const INIT: u32 = 0b101 << 8;
const STARTUP: u32 = 0b110 << 8;
const ASSERT: u32 = 1 << 14;
const PENDING: u32 = 1 << 12;

/// Why the local APIC cannot start CPUs.
#[derive(Clone, Copy, Debug)]
pub enum LapicError {
    /// `IA32_APIC_BASE` says the APIC is off, in x2APIC mode, or above the boot map.
    Mode(u64),
    /// A destination xAPIC mode cannot name.
    Destination(u32),
}

impl core::fmt::Display for LapicError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LapicError::Mode(msr) => write!(
                f,
                "the local APIC is not enabled in xAPIC mode below 64 GiB (IA32_APIC_BASE {msr:#x})"
            ),
            LapicError::Destination(id) => {
                write!(f, "APIC {id:#x} cannot be named in xAPIC mode")
            }
        }
    }
}

/// The running CPU's local APIC, in xAPIC mode.
#[derive(Clone, Copy, Debug)]
pub struct LocalApic {
    base: u64,
}

impl LocalApic {
    /// The running CPU's local APIC, from `IA32_APIC_BASE`.
    ///
    /// # Errors
    /// [`LapicError::Mode`] when it is disabled, in x2APIC mode, or its registers lie above
    /// the boot map.
    pub fn current() -> Result<Self, LapicError> {
        let msr = cpu::apic_base_msr();
        let base = msr & 0x000f_ffff_ffff_f000;
        if msr & BASE_ENABLED == 0 || msr & BASE_X2APIC != 0 || base >= entry::BOOT_MAP_BYTES {
            return Err(LapicError::Mode(msr));
        }
        Ok(LocalApic { base })
    }

    /// The physical address of its register page.
    pub fn base(&self) -> u64 {
        self.base
    }

    fn register(&self, offset: usize) -> *mut u32 {
        ptr::with_exposed_provenance_mut(self.base as usize + offset)
    }

    /// Whether the last IPI is still being sent.
    pub fn pending(&self) -> bool {
        // SAFETY: the APIC's register page lies in the boot map (`current` checks), and the
        // kernel's tables map it too, uncached (`kmain` hands it to `paging`); ICR low is an
        // aligned 32-bit register, and reading it has no side effect.
        unsafe { self.register(ICR_LOW).read_volatile() & PENDING != 0 }
    }

    /// Sends an INIT IPI to the CPU with APIC id `apic`.
    ///
    /// # Errors
    /// [`LapicError::Destination`] for an id above 255.
    pub fn send_init(&self, apic: u32) -> Result<(), LapicError> {
        self.send(apic, INIT | ASSERT)
    }

    /// Sends a STARTUP IPI to the CPU with APIC id `apic`: it starts in real mode at
    /// `vector << 12`.
    ///
    /// # Errors
    /// [`LapicError::Destination`] for an id above 255.
    pub fn send_startup(&self, apic: u32, vector: u8) -> Result<(), LapicError> {
        self.send(apic, STARTUP | ASSERT | u32::from(vector))
    }

    fn send(&self, apic: u32, command: u32) -> Result<(), LapicError> {
        if apic > 0xff {
            return Err(LapicError::Destination(apic));
        }
        // SAFETY: as in `pending`; writing the ICR's high word names the destination and sends
        // nothing, writing its low word sends the IPI, which reaches only the CPU named.
        unsafe {
            self.register(ICR_HIGH).write_volatile(apic << 24);
            self.register(ICR_LOW).write_volatile(command);
        }
        Ok(())
    }
}
