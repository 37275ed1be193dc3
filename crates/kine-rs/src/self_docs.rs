//! `kine-rs completions SHELL` and `kine-rs man`: shell completions and manual pages generated
//! from the same flag definitions the binary parses (`cli::command`), so they cannot drift.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;

/// Writes the completion script for `shell` to `out`.
pub fn completions(shell: clap_complete::Shell, out: &mut dyn Write) -> Result<()> {
    let mut command = crate::cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "kine-rs", &mut script);
    if shell == clap_complete::Shell::Bash {
        script = bash_fixed(&script);
    }
    out.write_all(&script).and_then(|()| out.flush()).context("writing the completion script")
}

/// clap_complete 4.6's bash script names a subcommand's branch from the program name with its
/// dash turned into a subcommand separator (`kine__subcmd__rs__subcmd__inspect`) but selects it
/// as `kine__rs__subcmd__inspect`, so nothing after a subcommand completed. Renames the branches.
fn bash_fixed(script: &[u8]) -> Vec<u8> {
    String::from_utf8_lossy(script).replace("kine__subcmd__rs__subcmd__", "kine__rs__subcmd__").into_bytes()
}

/// The manual pages: `kine-rs.1`, then `kine-rs-SUB.1` for each subcommand and
/// `kine-rs-SUB-SUBSUB.1` for theirs (those of `help` left out), each as (file name, page).
pub fn pages() -> Result<Vec<(String, Vec<u8>)>> {
    let mut command = crate::cli::command();
    command.build();
    let mut pages = Vec::new();
    collect(&command, &mut pages)?;
    Ok(pages)
}

/// A built command's display name is its path joined with dashes (`kine-rs-inspect-list`).
fn collect(command: &clap::Command, pages: &mut Vec<(String, Vec<u8>)>) -> Result<()> {
    let name = command.get_display_name().unwrap_or(command.get_name()).to_string();
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut page).with_context(|| format!("rendering {name}.1"))?;
    pages.push((format!("{name}.1"), page));
    for sub in command.get_subcommands().filter(|s| s.get_name() != "help") {
        collect(sub, pages)?;
    }
    Ok(())
}

/// `kine-rs man`: every page into `dir`, or kine-rs.1 to stdout.
pub fn man(dir: Option<&Path>) -> Result<()> {
    let pages = pages()?;
    let Some(dir) = dir else {
        let mut out = std::io::stdout().lock();
        out.write_all(&pages[0].1)?;
        return out.flush().context("writing kine-rs.1");
    };
    std::fs::create_dir_all(dir).with_context(|| format!("--dir {}: cannot create it", dir.display()))?;
    for (name, page) in &pages {
        let path = dir.join(name);
        std::fs::write(&path, page).with_context(|| format!("--dir: cannot write {}", path.display()))?;
    }
    eprintln!("kine-rs: wrote {} manual pages into {}", pages.len(), dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_for_the_program_and_each_subcommand() {
        let names: Vec<String> = pages().unwrap().into_iter().map(|(n, _)| n).collect();
        for expected in ["kine-rs.1", "kine-rs-migrate.1", "kine-rs-snapshot-restore.1", "kine-rs-inspect-history.1"] {
            assert!(names.iter().any(|n| n == expected), "{expected} missing from {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("help")), "{names:?}");
    }

    #[test]
    fn the_program_page_names_the_flags_and_their_variables() {
        let (_, page) = &pages().unwrap()[0];
        let page = String::from_utf8_lossy(page);
        for text in ["listen\\-address", "KINE_ENDPOINT", "emulated\\-etcd\\-version"] {
            assert!(page.contains(text), "kine-rs.1 lacks {text}");
        }
    }
}
