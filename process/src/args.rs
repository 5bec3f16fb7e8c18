//! Command lines: clap's usage errors as the one line every Loader binary
//! prints for bad input. clap renders an error as a paragraph, a blank line,
//! a usage line and a tip; a flag's own parser's message sits inside the
//! first paragraph.

use std::ffi::OsString;
use std::process::ExitCode;

/// Parses `args` (program name first) into `P`, or says why not in the way
/// every Loader binary does: `--help` and `--version` print and end with
/// success; a usage error prints `PROGRAM: error: <one line>` on stderr and
/// ends with exit status 2, clap's and most Unix tools' code for bad usage
/// (1 stays for errors met while running).
pub fn parse<P, I, T>(program: &str, args: I) -> Result<P, ExitCode>
where
    P: clap::Parser,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    match P::try_parse_from(args) {
        Ok(parsed) => Ok(parsed),
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{program}: error: {}", one_line(&e));
            Err(ExitCode::from(2))
        }
    }
}

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

    #[test]
    fn parse_ends_help_with_success_and_bad_usage_with_2() {
        assert!(parse::<Flags, _, _>("prog", ["prog", "--count", "3"]).is_ok_and(|f| f.count == 3));
        assert_eq!(parse::<Flags, _, _>("prog", ["prog", "--help"]).err(), Some(ExitCode::SUCCESS));
        assert_eq!(parse::<Flags, _, _>("prog", ["prog", "--count", "0"]).err(), Some(ExitCode::from(2)));
    }
}
