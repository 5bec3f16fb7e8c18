//! Plain text tables with aligned columns, for terminals and for grep.

/// Renders `rows` under `headers`, columns separated by two spaces.
pub(crate) fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let padded: Vec<String> = cells
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    let mut out = line(&mut headers.iter().copied());
    out.push('\n');
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_align() {
        let t = super::render(
            &["ID", "ADDRESS"],
            &[
                vec!["1".into(), "http://a:1".into()],
                vec!["22".into(), "b".into()],
            ],
        );
        assert_eq!(t, "ID  ADDRESS\n1   http://a:1\n22  b\n");
    }
}
