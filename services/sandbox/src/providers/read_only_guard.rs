//! The `local` provider's refusal of commands that would write under `/mnt/skills`.
//!
//! Under bwrap `/mnt/skills` is a read-only mount and the kernel refuses every write. The `local`
//! provider runs plain host processes: its skills view is read-only by mode (files 0444, directories
//! 0555), which stops a service running as an ordinary user, but root ignores modes. So before a local
//! command runs, its text is checked for the usual ways of writing a path — a redirection into it, or
//! the path as the target of `rm`, `mv`, `cp`, `touch`, `tee`, `sed -i`, `dd of=`, … — as DeerFlow's
//! `validate_local_bash_command_paths` does. This is a best effort, not a boundary (a script or
//! `sh -c "$(…)"` can still write), exactly like everything else about `local`; use bwrap for isolation.
//!
//! The tokenizer is hand-written (a few lines) because it must keep track of which operators were
//! quoted: `grep '>' /mnt/skills/x/SKILL.md` reads, `echo x > /mnt/skills/x` writes, and a plain word
//! splitter such as shlex loses that difference.

use crate::paths::SKILLS;

#[derive(Debug, PartialEq, Eq)]
enum Token {
    Word(String),
    Op(String),
}

fn tokenize(command: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = command.chars().peekable();
    let mut quote: Option<char> = None;
    let flush = |word: &mut String, in_word: &mut bool, tokens: &mut Vec<Token>| {
        if *in_word {
            tokens.push(Token::Word(std::mem::take(word)));
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => {
                if let Some(next) = chars.next() {
                    word.push(next);
                }
            }
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '\\') => {
                if let Some(next) = chars.next() {
                    word.push(next);
                    in_word = true;
                }
            }
            (None, c) if c.is_whitespace() && c != '\n' => flush(&mut word, &mut in_word, &mut tokens),
            (None, ';' | '&' | '|' | '>' | '<' | '(' | ')' | '\n' | '`') => {
                flush(&mut word, &mut in_word, &mut tokens);
                let mut op = c.to_string();
                while let Some(&next) = chars.peek() {
                    if matches!((c, next), ('&', '&') | ('|', '|') | ('>', '>' | '|' | '&') | ('&', '>')) {
                        op.push(next);
                        chars.next();
                    } else {
                        break;
                    }
                }
                tokens.push(Token::Op(op));
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    flush(&mut word, &mut in_word, &mut tokens);
    tokens
}

/// Commands whose every path argument is written (or removed).
const WRITES_ALL: [&str; 13] =
    ["rm", "rmdir", "touch", "mkdir", "truncate", "chmod", "chown", "chgrp", "tee", "unlink", "shred", "mv", "ln"];
/// Commands whose last argument (or `-t DIR`) is the one written.
const WRITES_LAST: [&str; 3] = ["cp", "install", "rsync"];
/// Words that run the next word as the command.
const PREFIXES: [&str; 7] = ["sudo", "env", "command", "nohup", "time", "nice", "exec"];

/// Whether `path` (as written in the command) names something under /mnt/skills. With `cwd_in_skills`,
/// relative paths do too.
fn in_skills(path: &str, cwd_in_skills: bool) -> bool {
    let path = path.trim_start_matches("file://");
    if path.starts_with('/') {
        path == SKILLS || path.starts_with("/mnt/skills/")
    } else {
        cwd_in_skills && !path.starts_with('-') && !path.is_empty()
    }
}

/// Why the command would write under /mnt/skills, if it looks like it does.
pub fn refusal(command: &str, cwd_in_skills: bool) -> Option<String> {
    let tokens = tokenize(command);
    let mut segment: Vec<&str> = Vec::new();
    let mut expect_target = false;
    let refuse = |what: &str| Some(format!("{what} would write under {SKILLS}, which is read-only"));
    for token in tokens.iter().chain(std::iter::once(&Token::Op(";".to_owned()))) {
        match token {
            Token::Op(op) if op.starts_with('>') || op == "&>" => expect_target = true,
            Token::Word(word) if expect_target => {
                expect_target = false;
                if in_skills(word, cwd_in_skills) {
                    return refuse(&format!("the redirection into {word:?}"));
                }
            }
            Token::Word(word) => segment.push(word),
            Token::Op(op) if op == "<" => {}
            Token::Op(_) => {
                if let Some(why) = segment_refusal(&segment, cwd_in_skills) {
                    return refuse(&why);
                }
                segment.clear();
            }
        }
    }
    None
}

fn segment_refusal(words: &[&str], cwd_in_skills: bool) -> Option<String> {
    let mut rest = words;
    // Assignments (X=1 cmd) and wrappers (sudo cmd) come before the command.
    while let Some((first, tail)) = rest.split_first() {
        let assignment =
            first.split_once('=').is_some_and(|(name, _)| !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_'));
        if assignment || PREFIXES.contains(first) {
            rest = tail;
        } else {
            break;
        }
    }
    let (name, args) = rest.split_first()?;
    let name: &str = name.rsplit('/').next().unwrap_or_default();
    let paths: Vec<&str> = args.iter().copied().filter(|a| !a.starts_with('-')).collect();
    let hit = |p: &&str| in_skills(p, cwd_in_skills);
    if WRITES_ALL.contains(&name) && paths.iter().any(hit) {
        return Some(format!("`{name}`"));
    }
    if WRITES_LAST.contains(&name) {
        let target = args.iter().position(|a| *a == "-t" || *a == "--target-directory").and_then(|i| args.get(i + 1)).or(paths.last());
        if target.is_some_and(hit) {
            return Some(format!("`{name}`"));
        }
    }
    if name == "sed" && args.iter().any(|a| a.starts_with("-i") || *a == "--in-place") && paths.iter().any(hit) {
        return Some("`sed -i`".to_owned());
    }
    if name == "dd" && args.iter().any(|a| a.strip_prefix("of=").is_some_and(|p| in_skills(p, cwd_in_skills))) {
        return Some("`dd of=`".to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_under_skills_are_recognised() {
        for command in [
            "echo x > /mnt/skills/public/a/SKILL.md",
            "echo x >>/mnt/skills/public/a/new",
            "cat a 2>&1 >| '/mnt/skills/custom/b/c'",
            "ls; rm -rf /mnt/skills/public/a",
            "true && sudo mv /mnt/skills/public/a /tmp/a",
            "cp notes.txt /mnt/skills/custom/b/",
            "cp -t /mnt/skills/custom/b notes.txt",
            "X=1 touch /mnt/skills/x",
            "sed -i s/a/b/ /mnt/skills/public/a/SKILL.md",
            "dd if=/dev/zero of=/mnt/skills/public/a/x count=1",
            "echo hi | tee -a /mnt/skills/public/a/log",
            "/bin/rm /mnt/skills/public/a/SKILL.md",
        ] {
            assert!(refusal(command, false).is_some(), "{command}");
        }
        assert!(refusal("rm SKILL.md", true).is_some(), "relative, with the cwd in /mnt/skills");
    }

    #[test]
    fn reads_of_skills_and_writes_elsewhere_pass() {
        for command in [
            "cat /mnt/skills/public/a/SKILL.md",
            "grep '>' /mnt/skills/public/a/SKILL.md",
            "cp /mnt/skills/public/a/template.md /mnt/user-data/outputs/",
            "python3 /mnt/skills/public/a/scripts/run.py > /mnt/user-data/outputs/out.txt",
            "echo '> /mnt/skills/x'",
            "rm -rf /mnt/user-data/workspace/tmp",
            "ls /mnt/skillsx; rm /mnt/skillsx/a",
        ] {
            assert_eq!(refusal(command, false), None, "{command}");
        }
        assert_eq!(refusal("rm SKILL.md", false), None);
    }
}
