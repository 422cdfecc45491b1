//! Shell parsing for guards: a command line becomes the simple commands it would run, each as
//! its program and arguments, so `npm i`, `env FOO=1 npm …`, `cd x && npm …`, `sudo npm …`,
//! `(npm ci)`, `$(npm bin)`, `bash -c "npm …"` and `cmd /c "npm …"` all name `npm`.
//!
//! This is a reader, not an interpreter: no expansion, no globbing, no aliases. It splits on
//! the control operators (`&&`, `||`, `;`, `|`, `&`, newlines), honours single and double quotes
//! and backslash escapes, descends into subshells, command substitutions and the command string
//! of `sh -c`/`bash -c`/`cmd /c`/`powershell -Command`, and skips what only prefixes a command:
//! variable assignments and the wrappers `env`, `sudo`, `doas`, `nohup`, `time`, `exec`,
//! `command`, `nice`, `timeout`, `xargs`. A line it cannot fully read (an unclosed quote) is
//! still read as far as it goes: a guard may match what a shell would start to run.

/// One simple command: the program (its file name, without directories or `.exe`) and its
/// arguments, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimpleCommand {
    pub program: String,
    pub args: Vec<String>,
}

/// Every simple command `line` would run, in order, at most `MAX_DEPTH` nestings deep.
pub fn simple_commands(line: &str) -> Vec<SimpleCommand> {
    let mut found = Vec::new();
    collect(line, 0, &mut found);
    found
}

const MAX_DEPTH: usize = 4;

fn collect(line: &str, depth: usize, found: &mut Vec<SimpleCommand>) {
    if depth > MAX_DEPTH {
        return;
    }
    let lexed = lex(line);
    for nested in &lexed.nested {
        collect(nested, depth + 1, found);
    }
    for words in lexed.commands {
        let Some(command) = unwrap_prefixes(&words) else {
            continue;
        };
        if let Some(script) = inner_script(&command) {
            collect(&script, depth + 1, found);
        }
        found.push(command);
    }
}

/// What lexing a line gives: the words of each simple command, and the text of every subshell
/// and command substitution (read on their own).
#[derive(Default)]
struct Lexed {
    commands: Vec<Vec<String>>,
    nested: Vec<String>,
}

struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    lexed: Lexed,
    words: Vec<String>,
    word: Option<String>,
}

impl Lexer<'_> {
    fn end_word(&mut self) {
        if let Some(word) = self.word.take() {
            self.words.push(word);
        }
    }

    fn end_command(&mut self) {
        self.end_word();
        if !self.words.is_empty() {
            self.lexed.commands.push(std::mem::take(&mut self.words));
        }
    }

    fn push(&mut self, c: char) {
        self.word.get_or_insert_with(String::new).push(c);
    }

    /// The text up to the `close` that balances an already consumed opener.
    fn balanced(&mut self, open: char, close: char) -> String {
        let mut depth = 1;
        let mut text = String::new();
        for c in self.chars.by_ref() {
            if c == open {
                depth += 1;
            } else if c == close {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            text.push(c);
        }
        text
    }

    /// A command substitution, `$(…)` (its `$` consumed) or `` `…` ``, read on its own; in the
    /// word it stands for, a placeholder.
    fn substitution(&mut self, opener: char) {
        let inner = if opener == '$' {
            self.chars.next();
            self.balanced('(', ')')
        } else {
            self.chars.by_ref().take_while(|&c| c != '`').collect()
        };
        self.lexed.nested.push(inner);
        self.push('_');
    }

    fn single_quoted(&mut self) {
        let word = self.word.get_or_insert_with(String::new);
        for c in self.chars.by_ref() {
            if c == '\'' {
                return;
            }
            word.push(c);
        }
    }

    fn double_quoted(&mut self) {
        self.word.get_or_insert_with(String::new);
        while let Some(c) = self.chars.next() {
            match c {
                '"' => return,
                '\\' => {
                    if let Some(next) = self.chars.next() {
                        if !matches!(next, '"' | '\\' | '$' | '`') {
                            self.push('\\');
                        }
                        self.push(next);
                    }
                }
                '$' if self.chars.peek() == Some(&'(') => self.substitution(c),
                '`' => self.substitution(c),
                _ => self.push(c),
            }
        }
    }

    fn step(&mut self, c: char) {
        match c {
            '\'' => self.single_quoted(),
            '"' => self.double_quoted(),
            '\\' => match self.chars.next() {
                Some('\n') | None => {}
                Some(next) => self.push(next),
            },
            '#' if self.word.is_none() => {
                // A comment runs to the end of the line.
                while self.chars.peek().is_some_and(|&c| c != '\n') {
                    self.chars.next();
                }
            }
            '$' if self.chars.peek() == Some(&'(') => self.substitution(c),
            '`' => self.substitution(c),
            '(' | '{' if self.word.is_none() && self.words.is_empty() => {
                let close = if c == '(' { ')' } else { '}' };
                let inner = self.balanced(c, close);
                self.lexed.nested.push(inner);
            }
            ';' | '|' | '&' | '\n' | '\r' => self.end_command(),
            '<' | '>' => {
                // A redirection's target is no argument of the command.
                self.end_word();
                while self
                    .chars
                    .peek()
                    .is_some_and(|&c| matches!(c, '>' | '&' | '|'))
                {
                    self.chars.next();
                }
                while self.chars.peek().is_some_and(|c| c.is_whitespace()) {
                    self.chars.next();
                }
                while self
                    .chars
                    .peek()
                    .is_some_and(|&c| !c.is_whitespace() && !";|&".contains(c))
                {
                    self.chars.next();
                }
            }
            c if c.is_whitespace() => self.end_word(),
            c => self.push(c),
        }
    }
}

fn lex(line: &str) -> Lexed {
    let mut lexer = Lexer {
        chars: line.chars().peekable(),
        lexed: Lexed::default(),
        words: Vec::new(),
        word: None,
    };
    while let Some(c) = lexer.chars.next() {
        lexer.step(c);
    }
    lexer.end_command();
    lexer.lexed
}

/// The program's name as a guard compares it: its file name, lower-cased, without `.exe`,
/// `.cmd` or `.bat` (Windows spells `npm` as `npm.cmd`).
pub fn program_name(word: &str) -> String {
    let base = word
        .rsplit(['/', '\\'])
        .next()
        .unwrap_or(word)
        .to_lowercase();
    for suffix in [".exe", ".cmd", ".bat"] {
        if let Some(stem) = base.strip_suffix(suffix) {
            return stem.to_owned();
        }
    }
    base
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit())
    })
}

/// Options of a wrapper that take a value (`sudo -u root npm` runs `npm`).
fn wrapper_value_options(wrapper: &str) -> &'static [&'static str] {
    match wrapper {
        "sudo" | "doas" => &["-u", "-g", "-h", "-p", "-C", "-D", "-r", "-t", "-U"],
        "env" => &["-u", "-C", "-S"],
        "nice" => &["-n"],
        "timeout" => &["-s", "-k", "--signal", "--kill-after"],
        "xargs" => &["-I", "-n", "-P", "-L", "-d", "-E", "-s", "-a"],
        _ => &[],
    }
}

/// The command behind variable assignments and wrappers, or `None` when only they remain.
fn unwrap_prefixes(words: &[String]) -> Option<SimpleCommand> {
    let mut rest = words;
    loop {
        while rest.first().is_some_and(|w| is_assignment(w)) {
            rest = &rest[1..];
        }
        let program = program_name(rest.first()?);
        let wrapper = matches!(
            program.as_str(),
            "env"
                | "sudo"
                | "doas"
                | "nohup"
                | "time"
                | "exec"
                | "command"
                | "nice"
                | "timeout"
                | "xargs"
                | "builtin"
                | "stdbuf"
        );
        if !wrapper {
            return Some(SimpleCommand {
                program,
                args: rest[1..].to_vec(),
            });
        }
        rest = &rest[1..];
        let takes_value = wrapper_value_options(&program);
        while let Some(word) = rest.first() {
            if word == "--" {
                rest = &rest[1..];
                break;
            }
            if !word.starts_with('-') {
                break;
            }
            let skip = if takes_value.contains(&word.as_str()) {
                2
            } else {
                1
            };
            rest = rest.get(skip..).unwrap_or(&[]);
        }
        if program == "timeout"
            && rest
                .first()
                .is_some_and(|w| w.starts_with(|c: char| c.is_ascii_digit()))
        {
            rest = &rest[1..];
        }
    }
}

/// The command string a shell runs for `command`: `sh -c '…'`, `bash -lc "…"`,
/// `cmd /c …`, `powershell -Command …`.
fn inner_script(command: &SimpleCommand) -> Option<String> {
    let args = &command.args;
    match command.program.as_str() {
        "sh" | "bash" | "zsh" | "dash" | "ksh" | "fish" => {
            let at = args
                .iter()
                .position(|a| a.starts_with('-') && !a.starts_with("--") && a.contains('c'))?;
            args.get(at + 1).cloned()
        }
        "cmd" => {
            let at = args
                .iter()
                .position(|a| a.eq_ignore_ascii_case("/c") || a.eq_ignore_ascii_case("/k"))?;
            let script = args[at + 1..].join(" ");
            (!script.is_empty()).then_some(script)
        }
        "powershell" | "pwsh" => {
            let at = args.iter().position(|a| {
                let a = a.to_ascii_lowercase();
                a == "-command" || a == "-c"
            })?;
            let script = args[at + 1..].join(" ");
            (!script.is_empty()).then_some(script)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn programs(line: &str) -> Vec<String> {
        simple_commands(line)
            .into_iter()
            .map(|c| {
                std::iter::once(c.program)
                    .chain(c.args)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }

    #[test]
    fn a_command_line_reads_as_the_simple_commands_it_runs() {
        let table: &[(&str, &[&str])] = &[
            ("npm i", &["npm i"]),
            ("npx prettier --write .", &["npx prettier --write ."]),
            ("env FOO=1 npm install", &["npm install"]),
            ("FOO=1 BAR=\"a b\" npm test", &["npm test"]),
            ("cd web && npm install", &["cd web", "npm install"]),
            ("cd web; npm ci || yarn", &["cd web", "npm ci", "yarn"]),
            (
                "cat package.json | npm exec foo",
                &["cat package.json", "npm exec foo"],
            ),
            ("sudo -u root npm i -g pnpm", &["npm i -g pnpm"]),
            ("sudo -E env PATH=/x npm run build", &["npm run build"]),
            ("(cd web && npm ci)", &["cd web", "npm ci"]),
            ("echo $(npm bin)/tsc", &["npm bin", "echo _/tsc"]),
            ("echo `npm root`", &["npm root", "echo _"]),
            (
                "bash -c 'npm install && npm test'",
                &["npm install", "npm test", "bash -c npm install && npm test"],
            ),
            (
                "bash -lc \"cd x && python manage.py migrate\"",
                &[
                    "cd x",
                    "python manage.py migrate",
                    "bash -lc cd x && python manage.py migrate",
                ],
            ),
            (
                "cmd /c \"npm install\"",
                &["npm install", "cmd /c npm install"],
            ),
            ("cmd.exe /C npm.cmd ci", &["npm ci", "cmd /C npm.cmd ci"]),
            (
                "powershell -Command \"npm install\"",
                &["npm install", "powershell -Command npm install"],
            ),
            ("/usr/bin/python3 -m pytest", &["python3 -m pytest"]),
            ("echo 'npm install' > notes.txt", &["echo npm install"]),
            (
                "git commit -m \"use npm, not yarn\"",
                &["git commit -m use npm, not yarn"],
            ),
            ("timeout 30 npm test", &["npm test"]),
            ("nohup npm start &", &["npm start"]),
            (
                "find . -name '*.js' | xargs -n 1 node",
                &["find . -name *.js", "node"],
            ),
            ("ls # && npm i", &["ls"]),
            ("echo \"unclosed && npm i", &["echo unclosed && npm i"]),
            ("FOO=1", &[]),
            ("{ npm ci; }", &["npm ci"]),
            (
                "python3 -c \"print('\\\"hi\\\"')\"",
                &["python3 -c print('\"hi\"')"],
            ),
        ];
        for (line, expected) in table {
            assert_eq!(programs(line), *expected, "{line}");
        }
    }

    #[test]
    fn program_names_drop_directories_case_and_windows_suffixes() {
        assert_eq!(program_name("/usr/local/bin/npm"), "npm");
        assert_eq!(program_name("C:\\Program Files\\nodejs\\NPM.CMD"), "npm");
        assert_eq!(program_name("python.exe"), "python");
        assert_eq!(program_name("./node_modules/.bin/jest"), "jest");
    }
}
