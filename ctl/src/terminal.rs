//! The terminal while `loaderctl top` runs, on crossterm: the alternate
//! screen, the cursor hidden, keys read as they are typed (raw mode). A
//! frame replaces the last one line by line, rewriting only the lines that
//! changed, each clipped to the terminal's width and the frame to its
//! height; a resize redraws the whole frame at the new size. `q`, Esc or
//! Ctrl-C quits (raw mode makes Ctrl-C a key); SIGTERM is handled by
//! `crate::signals`. Whatever way `top` ends, dropping the [`Screen`] puts
//! the terminal back as it was. When stdin is not a terminal, no keys are
//! read: Ctrl-C stays a signal.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use crossterm::{cursor, queue, style, terminal};

/// What the keyboard (or the terminal) said while `top` waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Input {
    /// q, Esc or Ctrl-C.
    Quit,
    /// The terminal changed size: draw the frame again.
    Resized,
}

/// The terminal, taken over until dropped.
#[derive(Debug)]
pub(crate) struct Screen {
    /// Raw mode is on (stdin is a terminal): keys come as events.
    keys: bool,
    /// The lines on screen, as drawn (clipped), and the last frame whole
    /// (drawn again after a resize).
    shown: Mutex<(Vec<String>, String)>,
}

impl Screen {
    /// Switches to the alternate screen and starts reading keys.
    pub(crate) fn open() -> anyhow::Result<Screen> {
        let keys = std::io::stdin().is_terminal();
        if keys {
            terminal::enable_raw_mode().map_err(|e| anyhow::anyhow!("cannot set the terminal up: {e}"))?;
        }
        let screen = Screen { keys, shown: Mutex::new((Vec::new(), String::new())) };
        let mut out = std::io::stdout().lock();
        // A closed stdout leaves nothing to draw on; the loop ends on q or a
        // signal all the same.
        let _ = queue!(out, terminal::EnterAlternateScreen, cursor::Hide, terminal::Clear(terminal::ClearType::All));
        let _ = out.flush();
        Ok(screen)
    }

    /// Waits up to `limit` for a key or a resize.
    pub(crate) fn input(&self, limit: Duration) -> Option<Input> {
        if !self.keys {
            std::thread::sleep(limit);
            return None;
        }
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if !event::poll(left).unwrap_or(false) {
                return None;
            }
            match event::read() {
                Ok(Event::Key(key)) if quits(&key) => return Some(Input::Quit),
                Ok(Event::Resize(..)) => return Some(Input::Resized),
                Ok(_) => continue,
                // stdin went away: nothing more to read; wait out the rest.
                Err(_) => {
                    std::thread::sleep(left);
                    return None;
                }
            }
        }
    }

    /// Replaces what is on screen with `frame`, rewriting the lines that
    /// changed.
    pub(crate) fn draw(&self, frame: &str) {
        // A terminal that does not know its size (0 x 0) is not clipped.
        let size = terminal::size().ok().filter(|&(w, h)| w > 0 && h > 0);
        let mut shown = self.shown.lock().unwrap_or_else(|p| p.into_inner());
        let lines = clip(frame, size);
        let mut out = std::io::stdout().lock();
        let _ = paint(&mut out, &shown.0, &lines);
        let _ = out.flush();
        *shown = (lines, frame.to_owned());
    }

    /// Draws the last frame again from a blank screen (after a resize).
    pub(crate) fn redraw(&self) {
        let frame = {
            let mut shown = self.shown.lock().unwrap_or_else(|p| p.into_inner());
            shown.0.clear();
            shown.1.clone()
        };
        let mut out = std::io::stdout().lock();
        let _ = queue!(out, terminal::Clear(terminal::ClearType::All));
        drop(out);
        self.draw(&frame);
    }
}

/// q, Esc, or Ctrl-C (a key in raw mode).
fn quits(key: &KeyEvent) -> bool {
    key.kind != KeyEventKind::Release
        && match key.code {
            KeyCode::Char('q' | 'Q') | KeyCode::Esc => true,
            KeyCode::Char('c') => key.modifiers.contains(KeyModifiers::CONTROL),
            _ => false,
        }
}

/// The lines of `frame` as they fit a terminal of `size` (columns, rows):
/// each cut at the width, and no more lines than rows.
fn clip(frame: &str, size: Option<(u16, u16)>) -> Vec<String> {
    let (width, height) = size.map_or((usize::MAX, usize::MAX), |(w, h)| (usize::from(w), usize::from(h)));
    frame.lines().take(height).map(|l| l.chars().take(width).collect()).collect()
}

/// Writes to `out` what turns the screen's `before` lines into `after`:
/// the lines that differ, each from its row's start to its end, and blanks
/// the rows `after` no longer uses.
fn paint(out: &mut impl Write, before: &[String], after: &[String]) -> std::io::Result<()> {
    for (row, line) in after.iter().enumerate() {
        if before.get(row) != Some(line) {
            let row = u16::try_from(row).unwrap_or(u16::MAX);
            queue!(out, cursor::MoveTo(0, row), style::Print(line), terminal::Clear(terminal::ClearType::UntilNewLine))?;
        }
    }
    for row in after.len()..before.len() {
        let row = u16::try_from(row).unwrap_or(u16::MAX);
        queue!(out, cursor::MoveTo(0, row), terminal::Clear(terminal::ClearType::CurrentLine))?;
    }
    Ok(())
}

impl Drop for Screen {
    fn drop(&mut self) {
        let mut out = std::io::stdout().lock();
        let _ = queue!(out, cursor::Show, terminal::LeaveAlternateScreen);
        let _ = out.flush();
        if self.keys {
            let _ = terminal::disable_raw_mode();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn only_changed_lines_are_written_and_left_over_rows_blanked() {
        let before = lines(&["title", "WORKERS 2", "w1 busy", "w2 idle"]);
        let after = lines(&["title", "WORKERS 1", "w1 busy"]);
        let mut out = Vec::new();
        paint(&mut out, &before, &after).expect("paint");
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("WORKERS 1"), "{text:?}");
        assert!(!text.contains("title") && !text.contains("w1 busy"), "unchanged lines are not written: {text:?}");
        // Row 3 (the fourth) is blanked: cursor to row 4, column 1, then
        // clear the line.
        assert!(text.contains("\x1b[4;1H\x1b[2K"), "{text:?}");
        let mut again = Vec::new();
        paint(&mut again, &after, &after).expect("paint");
        assert!(again.is_empty(), "the same frame writes nothing");
    }

    #[test]
    fn frames_are_clipped_to_the_terminal() {
        let frame = "0123456789\nabc\nlast";
        assert_eq!(clip(frame, Some((4, 2))), lines(&["0123", "abc"]));
        assert_eq!(clip(frame, None), lines(&["0123456789", "abc", "last"]));
        assert_eq!(clip("héllo", Some((2, 5))), lines(&["hé"]));
    }

    #[test]
    fn q_esc_and_ctrl_c_quit_and_other_keys_do_not() {
        let key = |code, modifiers| KeyEvent::new(code, modifiers);
        assert!(quits(&key(KeyCode::Char('q'), KeyModifiers::NONE)));
        assert!(quits(&key(KeyCode::Esc, KeyModifiers::NONE)));
        assert!(quits(&key(KeyCode::Char('c'), KeyModifiers::CONTROL)));
        assert!(!quits(&key(KeyCode::Char('c'), KeyModifiers::NONE)));
        assert!(!quits(&key(KeyCode::Char('x'), KeyModifiers::NONE)));
    }
}
