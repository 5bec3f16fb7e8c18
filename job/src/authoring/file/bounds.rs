//! Bounds checked on a spec's text before a YAML or JSON parser sees it:
//! its size, and how deeply it nests.
//!
//! The YAML parser (libyaml, under serde_norway) does work per token in
//! proportion to how many collections are open, so a hostile text nested
//! 100,000 levels deep took it 37-83 s to reject; serde's recursion limit
//! only applies after that. One pass over the bytes finds the depth first,
//! in milliseconds, so such a text is refused before any parser runs.
//!
//! The pass follows YAML's lexical rules as far as nesting needs them:
//! quoted scalars (escapes, line breaks), comments, flow collections,
//! plain scalars (a quote inside one is text, not a string), block
//! scalars (`|`, `>`: their lines are text), node properties (`&a`, `!t`,
//! `*a`), and block structure (each deeper indentation, and each compact
//! `- `, `? `, `: ` on a line, counts a level). It over-counts (a block
//! mapping's value on its own line counts as a level of its own), never
//! under-counts, on any text the parser would read past. JSON is YAML's
//! flow style, so the same pass bounds JSON specs.

/// Most levels a spec may nest: specs need under 10 (a mixture of a
/// dataset with a transform's parameters); 64 leaves room and refuses the
/// hostile ones.
pub const MAX_DEPTH: usize = 64;

/// Largest spec text: the coordinator's limit on a request message
/// ([`loader_proto::MAX_REQUEST_MESSAGE`]), since a spec
/// larger than that could never be submitted.
pub const MAX_SPEC_BYTES: usize = loader_proto::MAX_REQUEST_MESSAGE as usize;

/// What the scanner expects next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// The start of a node: a quote here opens a quoted scalar.
    Token,
    /// Inside a plain (unquoted) scalar: quotes are text.
    Plain,
    /// Just after a node (a quoted scalar, a closed collection).
    After,
}

/// The line (1-based) where `text` first nests deeper than `max` levels,
/// if it does.
pub(super) fn too_deep(text: &str, max: usize) -> Option<usize> {
    let b = text.as_bytes();
    let n = b.len();
    // Block context: the columns of the open indentation levels.
    let mut indents: Vec<usize> = Vec::new();
    // Levels opened by `- `, `? `, `: ` on the current line.
    let mut compact = 0usize;
    let mut flow = 0usize;
    let mut at = At::Token;
    // The column a line must be indented past to continue the plain
    // scalar or block scalar the previous line left open.
    let mut parent = 0usize;
    // The column of the innermost block node on this line (a key's).
    let mut node_col = 0usize;
    let mut plain_open = false;
    let mut block_scalar = false;
    let mut line = 1usize;
    let mut line_begin = 0usize;
    let mut i = 0usize;
    let mut at_line_start = true;
    while i < n {
        if at_line_start {
            at_line_start = false;
            line_begin = i;
            let indent = b[i..].iter().take_while(|&&c| c == b' ').count();
            let blank = i + indent >= n || matches!(b[i + indent], b'\n' | b'\r' | b'#');
            if flow == 0 {
                if block_scalar && (blank || indent > parent) {
                    i = next_line(b, i);
                    line += 1;
                    at_line_start = true;
                    continue;
                }
                block_scalar = false;
                if !blank {
                    if plain_open && indent > parent {
                        at = At::Plain;
                    } else {
                        at = At::Token;
                        while indents.last().is_some_and(|&c| c > indent) {
                            indents.pop();
                        }
                        if indents.last() != Some(&indent) {
                            indents.push(indent);
                        }
                        compact = 0;
                        node_col = indent;
                        parent = indent;
                    }
                    plain_open = false;
                }
            }
            i += indent;
            if indents.len() + compact + flow > max {
                return Some(line);
            }
            continue;
        }
        let c = b[i];
        let next = b.get(i + 1).copied();
        let spaced = |x: Option<u8>| matches!(x, None | Some(b' ' | b'\t' | b'\r' | b'\n'));
        let col = i - line_begin;
        match c {
            b'\n' => {
                plain_open = flow == 0 && at == At::Plain;
                line += 1;
                i += 1;
                at_line_start = true;
                continue;
            }
            b' ' | b'\t' | b'\r' => {
                if at == At::After {
                    at = At::Token;
                }
            }
            b'#' if i == 0 || spaced(Some(b[i - 1])) => {
                at = At::After;
                i = line_end(b, i);
                continue;
            }
            b'"' | b'\'' if at == At::Token => {
                let (end, lines) = quoted_end(b, i);
                line += lines;
                if lines > 0 {
                    line_begin = b[..end].iter().rposition(|&x| x == b'\n').map_or(0, |p| p + 1);
                }
                i = end;
                at = At::After;
                continue;
            }
            b'[' | b'{' if at == At::Token || flow > 0 => {
                flow += 1;
                at = At::Token;
            }
            b']' | b'}' if flow > 0 => {
                flow -= 1;
                at = At::After;
            }
            b',' if flow > 0 => at = At::Token,
            b':' if spaced(next) || (flow > 0 && (at == At::After || matches!(next, Some(b',' | b'[' | b']' | b'{' | b'}')))) => {
                if flow == 0 {
                    parent = node_col;
                    compact += 1;
                }
                at = At::Token;
            }
            b'-' | b'?' if at == At::Token && flow == 0 && spaced(next) => {
                parent = col;
                node_col = col + 1 + b[i + 1..].iter().take_while(|&&x| x == b' ').count();
                compact += 1;
            }
            b'|' | b'>' if at == At::Token && flow == 0 => {
                block_scalar = true;
                at = At::After;
                i = line_end(b, i);
                continue;
            }
            b'&' | b'!' | b'*' if at == At::Token => {
                while i < n && !spaced(Some(b[i])) && !(flow > 0 && matches!(b[i], b',' | b'[' | b']' | b'{' | b'}')) {
                    i += 1;
                }
                at = if c == b'*' { At::After } else { At::Token };
                continue;
            }
            _ => {
                if at != At::Plain {
                    at = At::Plain;
                }
            }
        }
        if indents.len() + compact + flow > max {
            return Some(line);
        }
        i += 1;
    }
    None
}

/// Where the line holding `i` ends (its `\n`, or the end of the text).
fn line_end(b: &[u8], i: usize) -> usize {
    b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |p| i + p)
}

/// The start of the line after the one holding `i`.
fn next_line(b: &[u8], i: usize) -> usize {
    (line_end(b, i) + 1).min(b.len())
}

/// Where the quoted scalar opening at `i` ends (just past its closing
/// quote, or the end of an unterminated text), and how many line breaks it
/// holds. `\` escapes in double quotes, `''` is a quote in single quotes.
fn quoted_end(b: &[u8], i: usize) -> (usize, usize) {
    let quote = b[i];
    let mut j = i + 1;
    let mut lines = 0;
    while j < b.len() {
        match b[j] {
            b'\n' => lines += 1,
            b'\\' if quote == b'"' => {
                if b.get(j + 1) == Some(&b'\n') {
                    lines += 1;
                }
                j += 1;
            }
            c if c == quote => {
                if quote == b'\'' && b.get(j + 1) == Some(&b'\'') {
                    j += 1;
                } else {
                    return (j + 1, lines);
                }
            }
            _ => {}
        }
        j += 1;
    }
    (b.len(), lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(text: &str) -> usize {
        (0..100).find(|&max| too_deep(text, max).is_none()).expect("under 100")
    }

    #[test]
    fn flow_and_block_nesting_are_counted() {
        assert_eq!(depth("a: 1"), 2);
        assert_eq!(depth("a: [[[1]]]"), 5);
        assert_eq!(depth("{\"a\": {\"b\": [1, 2]}}"), 4);
        assert!(depth("a:\n  b:\n    c: 1\n") >= 3);
        assert!(depth("- - - - - x") >= 5);
        assert_eq!(too_deep(&format!("a: {}1{}", "[".repeat(100), "]".repeat(100)), MAX_DEPTH), Some(1));
        let block: String = (0..80).map(|i| format!("{}k:\n", " ".repeat(i))).collect();
        assert_eq!(too_deep(&block, MAX_DEPTH), Some(MAX_DEPTH));
    }

    #[test]
    fn brackets_in_text_are_not_nesting() {
        let deep = "]".repeat(200);
        for text in [
            format!("a: \"{deep}\"\nb: [1]"),
            format!("a: '{deep}'\nb: [1]"),
            format!("a: x # {deep}\nb: [1]"),
            format!("a: |\n  {deep}\n  [[[[\nb: [1]"),
            format!("a: x{deep}\nb: [1]"),
        ] {
            assert!(depth(&text) < 5, "{text}");
        }
        // Brackets inside a string are text; opening brackets after text
        // that only looks like a string (a quote inside a plain scalar, an
        // escaped quote, a plain scalar's next line) still count.
        let open = "[".repeat(100);
        assert_eq!(too_deep(&format!("a: \"{open}\""), MAX_DEPTH), None);
        for text in [
            format!("a: [x \"y, \"]\", {open}"),
            format!("a: it's\nb: {open}\nc: '"),
            format!("a: \"x\\\"\" {open}"),
            format!("a: 'x''' {open}"),
            format!("a: x\n  \"y\nb: {open}\nc: \""),
        ] {
            assert!(too_deep(&text, MAX_DEPTH).is_some(), "{text}");
        }
    }
}
