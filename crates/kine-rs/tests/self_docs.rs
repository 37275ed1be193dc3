//! The shell completions and manual pages the binary writes about itself (`kine-rs completions`,
//! `kine-rs man`): bash completes flags, subcommands and values with them; groff typesets every
//! page without a warning.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_kine-rs");

fn run(args: &[&str]) -> std::process::Output {
    let out = Command::new(BIN).args(args).output().expect("run kine-rs");
    assert!(out.status.success(), "kine-rs {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// What bash's programmable completion offers for the last word of `line` (empty to complete a
/// new word), with the script `kine-rs completions bash` prints loaded.
fn bash_completes(script: &Path, line: &str) -> Vec<String> {
    let program = format!(
        r#"source {script}
words=({line})
[ "{trailing}" = yes ] && words+=("")
COMP_WORDS=("${{words[@]}}"); COMP_CWORD=$(( ${{#words[@]}} - 1 ))
COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}
spec=$(complete -p kine-rs) || exit 3
fn=${{spec#*-F }}; fn=${{fn%% *}}
"$fn" kine-rs "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
printf '%s\n' "${{COMPREPLY[@]}}""#,
        script = script.display(),
        trailing = if line.ends_with(' ') { "yes" } else { "no" },
    );
    let out = Command::new("bash").arg("-c").arg(program).output().expect("bash");
    assert!(out.status.success(), "bash: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).filter(|l| !l.is_empty()).collect()
}

#[test]
fn bash_completes_flags_subcommands_and_values() {
    let dir = kine_testkit::TempDir::new("completions");
    let script = dir.path().join("kine-rs.bash");
    std::fs::write(&script, run(&["completions", "bash"]).stdout).unwrap();
    let cases: &[(&str, &[&str])] = &[
        ("kine-rs --endp", &["--endpoint"]),
        ("kine-rs mig", &["migrate"]),
        ("kine-rs inspect hi", &["history"]),
        ("kine-rs inspect --output ", &["text", "json"]),
        ("kine-rs migrate --to-go", &["--to-go-kine"]),
        ("kine-rs snapshot ", &["restore"]),
    ];
    for (line, expected) in cases {
        let offered = bash_completes(&script, line);
        for word in *expected {
            assert!(offered.iter().any(|o| o == word), "{line:?}: {word} not among {offered:?}");
        }
    }
    // A subcommand's completions include the program flags it takes too.
    assert!(bash_completes(&script, "kine-rs inspect status --endp").contains(&"--endpoint".to_string()));
}

#[test]
fn every_shell_gets_a_script() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = run(&["completions", shell]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("emulated-etcd-version"), "{shell}: no flag in the script");
    }
    let out = Command::new(BIN).args(["completions", "tcsh"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'tcsh'"));
}

#[test]
fn groff_typesets_every_manual_page_without_a_warning() {
    let dir = kine_testkit::TempDir::new("man");
    let pages = dir.path().join("man1");
    let out = run(&["man", "--dir", pages.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("manual pages into"));
    let mut names: Vec<String> =
        std::fs::read_dir(&pages).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    for expected in ["kine-rs.1", "kine-rs-migrate.1", "kine-rs-inspect-list.1", "kine-rs-completions.1"] {
        assert!(names.iter().any(|n| n == expected), "{expected} not in {names:?}");
    }
    for name in &names {
        // -k: the input is UTF-8 (as man(1) reads it); -ww: every warning but the line breaks a
        // long unbreakable value (a URL form) forces at any width.
        let out = Command::new("groff")
            .args(["-k", "-man", "-Tutf8", "-ww", "-Wbreak", "-z"])
            .arg(pages.join(name))
            .output()
            .expect("groff (Debian's groff-base) is needed to check the manual pages");
        assert!(out.status.success() && out.stderr.is_empty(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // Without --dir: the program's page on stdout.
    let page = String::from_utf8(run(&["man"]).stdout).unwrap();
    assert!(page.starts_with(".ie") || page.contains(".TH kine-rs 1"), "{}", &page[..page.len().min(200)]);
}
