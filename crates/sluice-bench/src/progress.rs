//! The progress bar on stderr: steps done out of planned, elapsed time and the current step.
//! Redraws one line on a terminal, prints one line per step otherwise (CI logs).

use std::io::{IsTerminal, Write};
use std::time::Instant;

pub struct Progress {
    total: usize,
    done: usize,
    start: Instant,
    tty: bool,
}

impl Progress {
    pub fn new(total: usize) -> Self {
        Progress {
            total: total.max(1),
            done: 0,
            start: Instant::now(),
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// Shows `label` as the step now running.
    pub fn show(&self, label: &str) {
        let width = 30;
        let filled = (self.done * width / self.total).min(width);
        let secs = self.start.elapsed().as_secs();
        let line = format!(
            "[{}{}] {}/{} {:>2}m{:02}s {label}",
            "#".repeat(filled),
            "-".repeat(width - filled),
            self.done,
            self.total,
            secs / 60,
            secs % 60
        );
        let mut e = std::io::stderr().lock();
        if self.tty {
            let _ = write!(e, "\r\x1b[K{line}");
        } else {
            let _ = writeln!(e, "{line}");
        }
        let _ = e.flush();
    }

    /// Marks `n` steps done (skipped steps count as done).
    pub fn advance(&mut self, n: usize) {
        self.done = (self.done + n).min(self.total);
    }

    pub fn finish(&self) {
        if self.tty {
            eprintln!();
        }
    }
}
