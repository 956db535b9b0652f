//! Scratch files for tests that read them.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new empty directory whose name holds `tag`, the process id and a counter, so that tests
    /// running in parallel never share one.
    ///
    /// # Panics
    /// If the directory cannot be made.
    pub fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("numaframe-test-{}-{tag}-{n}", std::process::id()));
        // A directory left by an earlier process with the same id.
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create a temp dir");
        TempDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `text` to `rel` below the directory (making the directories on the way): its path.
    ///
    /// # Panics
    /// If the file cannot be written.
    pub fn put(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.0.join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).expect("create the file's directory");
        }
        fs::write(&p, text).expect("write the file");
        p
    }

    /// Removes `rel` below the directory, a file or a whole directory.
    ///
    /// # Panics
    /// If it cannot be removed.
    pub fn remove(&self, rel: &str) {
        let p = self.0.join(rel);
        if p.is_dir() {
            fs::remove_dir_all(p)
        } else {
            fs::remove_file(p)
        }
        .expect("remove the entry");
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
