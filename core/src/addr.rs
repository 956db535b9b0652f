//! Physical addresses, page frame numbers and buddy orders.
#![deny(unsafe_code)]

use core::fmt;

/// log2 of the base page size.
pub const PAGE_SHIFT: u32 = 12;
/// The base page size: 4 KiB.
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;
/// The largest buddy order: an order-18 block is 2^18 frames, 1 GiB.
pub const MAX_ORDER: u8 = 18;
/// Number of orders, `0..=MAX_ORDER`.
pub const NR_ORDERS: usize = MAX_ORDER as usize + 1;

/// A physical page frame number (physical address >> 12).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(transparent)]
pub struct Pfn(u64);

impl Pfn {
    /// The frame number `n`.
    pub const fn new(n: u64) -> Self {
        Self(n)
    }
    /// The frame number as an integer.
    pub const fn get(self) -> u64 {
        self.0
    }
    /// The physical address of the first byte of the frame.
    pub const fn addr(self) -> PhysAddr {
        PhysAddr(self.0 << PAGE_SHIFT)
    }
    /// `true` if the frame starts a naturally aligned block of `order`.
    pub const fn is_aligned(self, order: Order) -> bool {
        self.0 & (order.frames() - 1) == 0
    }
    /// The frame `n` frames further on, or `None` on overflow.
    pub const fn checked_add(self, n: u64) -> Option<Pfn> {
        match self.0.checked_add(n) {
            Some(v) => Some(Pfn(v)),
            None => None,
        }
    }
}

impl fmt::Debug for Pfn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pfn({:#x})", self.0)
    }
}

impl fmt::Display for Pfn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A physical byte address.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(transparent)]
pub struct PhysAddr(u64);

impl PhysAddr {
    /// The address `a`.
    pub const fn new(a: u64) -> Self {
        Self(a)
    }
    /// The address as an integer.
    pub const fn get(self) -> u64 {
        self.0
    }
    /// The frame that contains this address.
    pub const fn pfn(self) -> Pfn {
        Pfn(self.0 >> PAGE_SHIFT)
    }
    /// The frame that starts at this address, or `None` if it is not page aligned
    /// (`x86_64`'s `PhysFrame::from_start_address`).
    pub const fn try_pfn(self) -> Option<Pfn> {
        if self.0.is_multiple_of(PAGE_SIZE) {
            Some(Pfn(self.0 >> PAGE_SHIFT))
        } else {
            None
        }
    }
}

impl fmt::Debug for PhysAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PhysAddr({:#x})", self.0)
    }
}

/// A half-open range of page frames, `start..end`.
///
/// Invariant: `start <= end` (every constructor checks it), so `frames()` never underflows.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PhysRange {
    start: Pfn,
    end: Pfn,
}

impl PhysRange {
    /// The frames `start..end`; `None` if `end < start`.
    pub const fn new(start: Pfn, end: Pfn) -> Option<Self> {
        if end.0 < start.0 {
            None
        } else {
            Some(Self { start, end })
        }
    }
    /// The frames covering the page-aligned bytes `base..base + size`;
    /// `None` if either is not page aligned or the sum overflows.
    pub const fn from_bytes(base: PhysAddr, size: u64) -> Option<Self> {
        if !base.0.is_multiple_of(PAGE_SIZE) || !size.is_multiple_of(PAGE_SIZE) {
            return None;
        }
        match base.0.checked_add(size) {
            Some(end) => Some(Self {
                start: Pfn(base.0 >> PAGE_SHIFT),
                end: Pfn(end >> PAGE_SHIFT),
            }),
            None => None,
        }
    }
    /// First frame of the range.
    pub const fn start(&self) -> Pfn {
        self.start
    }
    /// One past the last frame of the range.
    pub const fn end(&self) -> Pfn {
        self.end
    }
    /// Number of frames in the range.
    pub const fn frames(&self) -> u64 {
        self.end.0 - self.start.0
    }
    /// `true` if the range holds no frame.
    pub const fn is_empty(&self) -> bool {
        self.end.0 == self.start.0
    }
    /// `true` if `pfn` lies in the range.
    pub const fn contains(&self, pfn: Pfn) -> bool {
        self.start.0 <= pfn.0 && pfn.0 < self.end.0
    }
    /// `true` if the two ranges share a frame.
    pub const fn overlaps(&self, other: &PhysRange) -> bool {
        self.start.0 < other.end.0 && other.start.0 < self.end.0
    }
    /// Size of the range in bytes.
    pub const fn bytes(&self) -> u64 {
        self.frames() << PAGE_SHIFT
    }
    /// The frames below `at` and the frames from `at` on; `at` is clamped into the range, so
    /// either part may be empty.
    pub const fn split_at(&self, at: Pfn) -> (PhysRange, PhysRange) {
        let cut = if at.0 < self.start.0 {
            self.start
        } else if at.0 > self.end.0 {
            self.end
        } else {
            at
        };
        (
            PhysRange {
                start: self.start,
                end: cut,
            },
            PhysRange {
                start: cut,
                end: self.end,
            },
        )
    }
}

/// A buddy order: a block of order `k` is `2^k` contiguous, naturally aligned frames.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(transparent)]
pub struct Order(u8);

impl Order {
    /// Order 0: one 4 KiB frame.
    pub const ZERO: Order = Order(0);
    /// Order 9: a 2 MiB block.
    pub const HUGE_2M: Order = Order(9);
    /// Order 18: a 1 GiB block, the largest.
    pub const MAX: Order = Order(MAX_ORDER);

    /// The order `k`, or `None` if `k > MAX_ORDER`.
    pub const fn try_new(k: u8) -> Option<Order> {
        if k <= MAX_ORDER { Some(Order(k)) } else { None }
    }
    /// The order `k`.
    ///
    /// # Panics
    /// If `k > MAX_ORDER`; use [`Order::try_new`] for untrusted input.
    #[inline]
    pub const fn new(k: u8) -> Order {
        match Self::try_new(k) {
            Some(o) => o,
            None => panic!("order above MAX_ORDER"),
        }
    }
    /// The order as an integer.
    pub const fn get(self) -> u8 {
        self.0
    }
    /// The order as an index into per-order arrays.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
    /// Number of frames in a block of this order.
    pub const fn frames(self) -> u64 {
        1 << self.0
    }
    /// Size in bytes of a block of this order.
    pub const fn bytes(self) -> u64 {
        PAGE_SIZE << self.0
    }
    /// All orders, ascending.
    pub fn all() -> impl DoubleEndedIterator<Item = Order> + Clone {
        (0..=MAX_ORDER).map(Order)
    }
}

impl fmt::Debug for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Order({})", self.0)
    }
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A huge page size numaframe pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum HugeSize {
    /// 2 MiB, order 9 (x86's PMD size and Linux's default huge page size there).
    Size2M,
    /// 1 GiB, order 18 (x86's PUD size).
    Size1G,
}

impl HugeSize {
    /// Both sizes, ascending.
    pub const ALL: [HugeSize; 2] = [HugeSize::Size2M, HugeSize::Size1G];

    /// The buddy order of a page of this size.
    pub const fn order(self) -> Order {
        match self {
            HugeSize::Size2M => Order::HUGE_2M,
            HugeSize::Size1G => Order::MAX,
        }
    }
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.order().bytes()
    }
    /// The size in KiB, as in Linux's `hugepages-2048kB` directory names.
    pub const fn kib(self) -> u64 {
        self.bytes() >> 10
    }
    /// The size of `bytes` bytes, or `None` if no huge page has that size.
    pub const fn from_bytes(bytes: u64) -> Option<HugeSize> {
        if bytes == HugeSize::Size2M.bytes() {
            Some(HugeSize::Size2M)
        } else if bytes == HugeSize::Size1G.bytes() {
            Some(HugeSize::Size1G)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_and_alignment() {
        assert_eq!(Order::MAX.frames(), 262_144);
        assert_eq!(Order::MAX.bytes(), 1 << 30);
        assert_eq!(Order::HUGE_2M.bytes(), 2 << 20);
        assert!(Order::try_new(19).is_none());
        assert!(Pfn(512).is_aligned(Order::HUGE_2M));
        assert!(!Pfn(513).is_aligned(Order::new(1)));
        assert_eq!(PhysAddr(0x1001).try_pfn(), None);
        assert_eq!(PhysAddr(0x2000).try_pfn(), Some(Pfn(2)));
    }

    #[test]
    fn huge_sizes() {
        use HugeSize::{Size1G, Size2M};
        assert_eq!(Size2M.order(), Order::HUGE_2M);
        assert_eq!(Size1G.order(), Order::MAX);
        assert_eq!(Size2M.bytes(), 2 << 20);
        assert_eq!(Size1G.bytes(), 1 << 30);
        assert_eq!(Size2M.kib(), 2048);
        assert_eq!(Size1G.kib(), 1_048_576);
        assert_eq!(HugeSize::from_bytes(2 << 20), Some(Size2M));
        assert_eq!(HugeSize::from_bytes(1 << 30), Some(Size1G));
        assert_eq!(HugeSize::from_bytes(4 << 20), None);
        assert_eq!(HugeSize::ALL, [Size2M, Size1G]);
    }

    #[test]
    fn ranges() {
        let r = PhysRange::from_bytes(PhysAddr(1 << 30), 1 << 30).unwrap();
        assert_eq!(r.frames(), 262_144);
        assert!(r.contains(Pfn(262_144)));
        assert!(!r.contains(Pfn(524_288)));
        assert!(PhysRange::from_bytes(PhysAddr(1), 4096).is_none());
        assert!(PhysRange::from_bytes(PhysAddr(!0xfff), 8192).is_none());
        assert!(PhysRange::new(Pfn(2), Pfn(1)).is_none());
        let r = PhysRange::new(Pfn(10), Pfn(20)).unwrap();
        assert_eq!(r.split_at(Pfn(15)).0.frames(), 5);
        assert_eq!(r.split_at(Pfn(5)).0.frames(), 0);
        assert_eq!(r.split_at(Pfn(25)).1.frames(), 0);
        assert_eq!(r.split_at(Pfn(25)).0, r);
    }
}
