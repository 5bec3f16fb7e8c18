//! Command lines: clap's usage errors as the one line every Loader binary
//! prints for bad input. clap renders an error as a paragraph, a blank line,
//! a usage line and a tip; a flag's own parser's message sits inside the
//! first paragraph.

/// The first paragraph of `e` joined into one line, without clap's
/// `error: ` prefix, with a pointer to `--help`.
pub fn one_line(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let report: Vec<&str> = rendered
        .lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let text = report.join(" ");
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    format!("{text} (see --help)")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Flags {
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        count: u32,
    }

    #[test]
    fn a_bad_value_is_one_line_naming_the_flag() {
        let e = Flags::try_parse_from(["prog", "--count", "0"]).expect_err("zero");
        let line = one_line(&e);
        assert!(line.contains("--count") && line.contains("'0'"), "{line}");
        assert!(line.ends_with("(see --help)") && !line.contains('\n'), "{line}");
        assert!(!line.starts_with("error:"), "{line}");
        let e = Flags::try_parse_from(["prog", "--colour"]).expect_err("unknown");
        assert!(!one_line(&e).contains('\n'));
    }
}
