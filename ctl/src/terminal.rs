//! The terminal while `loaderctl top` runs: the alternate screen with the
//! cursor hidden, frames drawn from the top left, and keys read as they are
//! typed (no Enter, no echo) so that `q` quits. Ctrl-C stays a signal
//! (ISIG is left on) and is handled with SIGTERM by `crate::signals`.
//! Whatever way `top` ends, dropping the [`Screen`] puts the terminal back as
//! it was. Plain ANSI escapes and termios: no terminal crate.

use std::io::{IsTerminal, Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::termios::{self, LocalFlags, SetArg, SpecialCharacterIndices, Termios};

/// Enter the alternate screen, hide the cursor.
const ENTER: &str = "\x1b[?1049h\x1b[?25l";
/// Show the cursor, leave the alternate screen.
const LEAVE: &str = "\x1b[?25h\x1b[?1049l";
/// Cursor to the top left, clear the screen.
const CLEAR: &str = "\x1b[H\x1b[2J";

/// The terminal, taken over until dropped.
#[derive(Debug)]
pub(crate) struct Screen {
    /// The settings of stdin before, put back on drop; None when stdin is
    /// not a terminal (keys are then read as they come, lines or not).
    saved: Option<Termios>,
    /// Set by the key thread when `q` (or Ctrl-C as a byte) was typed.
    quit: Arc<AtomicBool>,
}

impl Screen {
    /// Switches to the alternate screen and starts reading keys.
    pub(crate) fn open() -> anyhow::Result<Screen> {
        let stdin = std::io::stdin();
        let saved = if stdin.is_terminal() {
            let saved = termios::tcgetattr(&stdin)
                .map_err(|e| anyhow::anyhow!("cannot read the terminal's settings: {e}"))?;
            let mut keys = saved.clone();
            keys.local_flags
                .remove(LocalFlags::ICANON | LocalFlags::ECHO);
            keys.control_chars[SpecialCharacterIndices::VMIN as usize] = 1;
            keys.control_chars[SpecialCharacterIndices::VTIME as usize] = 0;
            termios::tcsetattr(&stdin, SetArg::TCSANOW, &keys)
                .map_err(|e| anyhow::anyhow!("cannot set the terminal up: {e}"))?;
            Some(saved)
        } else {
            None
        };
        let quit = Arc::new(AtomicBool::new(false));
        let typed = Arc::clone(&quit);
        // Blocked in read() for the life of the process; it holds nothing
        // that needs closing.
        std::thread::Builder::new()
            .name("loaderctl-keys".into())
            .spawn(move || {
                let mut stdin = std::io::stdin();
                let mut byte = [0u8];
                while let Ok(1) = stdin.read(&mut byte) {
                    if matches!(byte[0], b'q' | b'Q' | 0x03) {
                        typed.store(true, Ordering::SeqCst);
                        return;
                    }
                }
            })?;
        let screen = Screen { saved, quit };
        screen.write(ENTER);
        Ok(screen)
    }

    /// True once `q` was typed.
    pub(crate) fn quit_typed(&self) -> bool {
        self.quit.load(Ordering::SeqCst)
    }

    /// Replaces what is on screen with `frame`.
    pub(crate) fn draw(&self, frame: &str) {
        self.write(&format!("{CLEAR}{frame}"));
    }

    fn write(&self, s: &str) {
        let mut stdout = std::io::stdout().lock();
        // A closed stdout leaves nothing to draw on; the loop ends on q or
        // a signal all the same.
        let _ = stdout.write_all(s.as_bytes());
        let _ = stdout.flush();
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        self.write(LEAVE);
        if let Some(saved) = &self.saved {
            let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, saved);
        }
    }
}
