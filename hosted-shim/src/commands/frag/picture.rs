//! `numaframe frag --svg`: every node's pageblocks as a grid of small squares, coloured by what
//! each pageblock is doing, drawn with plotters' SVG backend.
//!
//! A node's pageblocks are laid out in address order, [`COLS`] to a row. A node with more than
//! [`MAX_CELLS`] pageblocks gets `ceil(pageblocks / MAX_CELLS)` of them per square, and a square
//! shows the state most of its pageblocks are in (ties go to the first in the order free,
//! whole, pool, long-lived, short-lived, cached); a split square's shade is the mean occupancy of its split pageblocks of that
//! class. The palette is the one docs/ gives for `frag --svg`.
#![deny(unsafe_code)]

use numaframe::{Class, Node, PageblockInfo, PageblockKind, ZoneKind};
use plotters::prelude::*;

use crate::error::CliError;

/// Squares per row.
pub const COLS: usize = 128;
/// The most squares one node gets.
pub const MAX_CELLS: u64 = 4096;
/// Frames in a pageblock.
const PB_FRAMES: u64 = 512;

/// Square size and the step from one square to the next, in pixels.
const CELL: i32 = 6;
const PITCH: i32 = 7;
const MARGIN: i32 = 12;
const LINE: i32 = 20;
const FONT: (&str, u32) = ("sans-serif", 14);

const FREE: RGBColor = RGBColor(0xEE, 0xEE, 0xEE);
const WHOLE: RGBColor = RGBColor(0x4D, 0x4D, 0x4D);
const POOL: RGBColor = RGBColor(0x7B, 0x32, 0x94);
const CACHED: RGBColor = RGBColor(0x1A, 0x96, 0x41);
/// Split pageblocks by class and frames in use: 1–128, 129–256, 257–384, 385–512 (white
/// blended with the class's colour at 25%, 50%, 75% and 100%).
const SPLIT: [[RGBColor; 4]; 2] = [
    [
        RGBColor(0xC7, 0xD7, 0xEF),
        RGBColor(0x8F, 0xAF, 0xDF),
        RGBColor(0x57, 0x87, 0xCF),
        RGBColor(0x1F, 0x5F, 0xBF),
    ],
    [
        RGBColor(0xF9, 0xD8, 0xC0),
        RGBColor(0xF2, 0xB0, 0x80),
        RGBColor(0xEC, 0x88, 0x40),
        RGBColor(0xE6, 0x61, 0x01),
    ],
];

/// What a square shows, in the order ties are broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Free,
    Whole,
    Pool,
    Long,
    Short,
    Cached,
}

const STATES: [State; 6] = [
    State::Free,
    State::Whole,
    State::Pool,
    State::Long,
    State::Short,
    State::Cached,
];

fn state(kind: PageblockKind) -> State {
    match kind {
        PageblockKind::Allocated => State::Whole,
        PageblockKind::Pool => State::Pool,
        PageblockKind::Split(Class::Short) => State::Short,
        PageblockKind::Split(_) => State::Long,
        PageblockKind::Cached(_) => State::Cached,
        // Free, and any state a later core adds: drawn as free rather than guessed at.
        _ => State::Free,
    }
}

/// One square: its state and, when split, the shade (0..4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cell {
    state: State,
    shade: usize,
}

impl Cell {
    fn colour(self) -> RGBColor {
        match self.state {
            State::Free => FREE,
            State::Whole => WHOLE,
            State::Pool => POOL,
            State::Long => SPLIT[0][self.shade],
            State::Short => SPLIT[1][self.shade],
            State::Cached => CACHED,
        }
    }
}

/// The pageblocks of one square being gathered.
#[derive(Default)]
struct Acc {
    n: u64,
    count: [u64; 6],
    /// Frames in use over the split pageblocks of each class.
    used: [u64; 2],
}

impl Acc {
    fn add(&mut self, p: &PageblockInfo) {
        let s = state(p.kind);
        self.n += 1;
        self.count[s as usize] += 1;
        if let State::Long | State::Short = s {
            self.used[s as usize - State::Long as usize] +=
                PB_FRAMES.saturating_sub(u64::from(p.free));
        }
    }

    fn cell(&self) -> Cell {
        let mut best = 0;
        for i in 1..STATES.len() {
            if self.count[i] > self.count[best] {
                best = i;
            }
        }
        let state = STATES[best];
        let shade = match state {
            State::Long | State::Short => {
                let c = state as usize - State::Long as usize;
                let mean = self.used[c].div_ceil(self.count[best].max(1));
                (mean.div_ceil(PB_FRAMES / 4).clamp(1, 4) - 1) as usize
            }
            _ => 0,
        };
        Cell { state, shade }
    }
}

/// One node's squares.
#[derive(Debug)]
pub struct NodeMap {
    /// The node.
    pub node: usize,
    /// Its pageblocks.
    pub pageblocks: u64,
    /// Pageblocks per square.
    pub per_cell: u64,
    cells: Vec<Cell>,
}

impl NodeMap {
    /// Walks the pageblocks of `node`'s zones, lowest zone first, into squares.
    pub fn collect(node: &Node) -> NodeMap {
        let pageblocks: u64 = ZoneKind::ALL
            .iter()
            .map(|k| {
                let c = node.zone(*k).pageblocks();
                c.free + c.whole + c.split.iter().sum::<u64>()
            })
            .sum();
        let per_cell = pageblocks.div_ceil(MAX_CELLS).max(1);
        let mut cells = Vec::with_capacity(pageblocks.div_ceil(per_cell) as usize);
        let mut acc = Acc::default();
        for k in ZoneKind::ALL {
            node.zone(k).for_each_pageblock(|p| {
                acc.add(&p);
                if acc.n == per_cell {
                    cells.push(acc.cell());
                    acc = Acc::default();
                }
            });
        }
        if acc.n > 0 {
            cells.push(acc.cell());
        }
        NodeMap {
            node: node.id().index(),
            pageblocks,
            per_cell,
            cells,
        }
    }

    /// Squares drawn.
    pub fn cells(&self) -> usize {
        self.cells.len()
    }

    fn rows(&self) -> i32 {
        self.cells.len().div_ceil(COLS) as i32
    }
}

fn drawing(e: impl std::fmt::Display) -> CliError {
    CliError::Internal(format!("drawing the SVG: {e}"))
}

/// The SVG document: `title`, then each node's grid, then the legend.
///
/// # Errors
/// [`CliError::Internal`] if plotters fails to draw.
pub fn render(title: &str, maps: &[NodeMap]) -> Result<String, CliError> {
    let width = 2 * MARGIN + COLS as i32 * PITCH;
    let grids: i32 = maps
        .iter()
        .map(|m| LINE + m.rows() * PITCH + LINE / 2)
        .sum();
    let height = 2 * MARGIN + LINE * 2 + grids + 4 * LINE;
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (width as u32, height as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(drawing)?;
        let text = |s: String, x: i32, y: i32| Text::new(s, (x, y), FONT.into_font());
        let square = |x: i32, y: i32, c: RGBColor| {
            Rectangle::new([(x, y), (x + CELL, y + CELL)], c.filled())
        };
        let mut y = MARGIN;
        root.draw(&text(title.to_string(), MARGIN, y))
            .map_err(drawing)?;
        y += LINE * 2;
        for m in maps {
            let per = if m.per_cell == 1 {
                "one per square".to_string()
            } else {
                format!("{} per square", m.per_cell)
            };
            root.draw(&text(
                format!(
                    "Node {}: {} pageblocks of 2 MiB, {per}",
                    m.node, m.pageblocks
                ),
                MARGIN,
                y,
            ))
            .map_err(drawing)?;
            y += LINE;
            for (i, c) in m.cells.iter().enumerate() {
                let (row, col) = ((i / COLS) as i32, (i % COLS) as i32);
                root.draw(&square(MARGIN + col * PITCH, y + row * PITCH, c.colour()))
                    .map_err(drawing)?;
            }
            y += m.rows() * PITCH + LINE / 2;
        }
        // The legend: one swatch per whole state, four per class of split pageblocks.
        let single = [
            (FREE, "free"),
            (WHOLE, "handed out whole (2 MiB or more)"),
            (POOL, "huge-page pool"),
            (CACHED, "split, lent to a CPU's cache"),
        ];
        for (i, (c, label)) in single.iter().enumerate() {
            let x = MARGIN + (i as i32 % 2) * 440;
            let yy = y + (i as i32 / 2) * LINE;
            root.draw(&square(x, yy + 4, *c)).map_err(drawing)?;
            root.draw(&text((*label).to_string(), x + 2 * PITCH, yy))
                .map_err(drawing)?;
        }
        y += 2 * LINE;
        for (class, label) in [(0, "long-lived"), (1, "short-lived")] {
            for (s, c) in SPLIT[class].iter().enumerate() {
                root.draw(&square(MARGIN + s as i32 * PITCH, y + 4, *c))
                    .map_err(drawing)?;
            }
            root.draw(&text(
                format!("split, {label}: 1-128, ..., 385-512 of 512 frames in use"),
                MARGIN + 5 * PITCH,
                y,
            ))
            .map_err(drawing)?;
            y += LINE;
        }
        root.present().map_err(drawing)?;
    }
    Ok(svg)
}
