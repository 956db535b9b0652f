//! hosted
