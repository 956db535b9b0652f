//! Hugepage command line (placeholder, being written).
