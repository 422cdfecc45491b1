//! Instructions in the user's own words, English and Chinese: which sentences state a rule,
//! a correction or a rejection, and the lesson each states as one imperative sentence.
//!
//! A sentence is read in this order: a dismissal ("no, that's fine", "don't worry about …",
//! "没关系", "不用了") says nothing to learn; leading discourse markers ("No,", "Actually,",
//! "不对，") are stripped, remembering whether one of them was a correction; a question ("?",
//! "吗", "要不要", "should we …", "can you …") is not a rule; then the first imperative pattern
//! that matches, anchored at the start of what remains, gives the lesson. A pattern's trigger
//! words must be the user's own words (see [`super::prose`]): never quoted text, inline code, a
//! URL or a path. Chinese markers are matched at the start of a clause, so `错了` inside `出错了`,
//! `不对` inside `不对称` and `算了` inside `计算了` are not markers.

use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;

use super::fold::{self, Folded};
use super::prose::Prose;

/// What the user did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Said what was wrong and what is right.
    Correction,
    /// Rejected the previous turn's work (undo, revert, "you broke X").
    Rejection,
    /// Stated how they want things done.
    Preference,
}

/// Something the lesson refers to that only the previous turn can name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reference {
    /// "undo / revert (that / the last change)", with the reason the user gave.
    Undo { reason: Option<String> },
    /// "you broke X" / "it messed up X".
    Broke { what: String },
    /// "use X instead" without saying instead of what.
    Instead { replacement: String },
}

/// One instruction found in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    pub action: Action,
    /// The lesson, one imperative sentence in the user's language.
    pub lesson: String,
    /// Byte range of the ORIGINAL text to cite (the sentence, and a reason sentence after it).
    pub cite: Range<usize>,
    /// Explicitly durable: always, never, remember, from now on, 以后, 记住, 统一 ….
    pub durable: bool,
    /// Explicitly about all the user's work, or a personal communication preference.
    pub user_wide: bool,
    pub reference: Option<Reference>,
}

/// Every instruction in `text`, in order.
pub fn instructions(text: &str) -> Vec<Instruction> {
    let folded = Folded::new(text);
    let prose = Prose::new(&folded.text);
    let reader = Reader {
        original: text,
        folded: &folded,
        prose: &prose,
    };
    let mut found = Vec::new();
    for line in &prose.lines {
        let sentences = fold::sentences(&folded.text, line.clone());
        let mut index = 0;
        while index < sentences.len() {
            let next = sentences.get(index + 1);
            match reader.sentence(sentences[index].clone(), next) {
                Some((instruction, used_next)) => {
                    found.push(instruction);
                    index += if used_next { 2 } else { 1 };
                }
                None => index += 1,
            }
        }
    }
    found
}

/// Whether `text` states a preference for all the user's work or a personal communication
/// preference (reply language, tone).
pub fn is_user_wide(text: &str) -> bool {
    user_wide(&Folded::new(text).text)
}

/// Whether `text` carries an instruction in the user's own words (used for turn eligibility).
pub fn has_instruction(text: &str) -> bool {
    !instructions(text).is_empty()
}

struct Reader<'a> {
    original: &'a str,
    folded: &'a Folded,
    prose: &'a Prose,
}

/// Leading words that correct the previous answer.
static CORRECTION_MARKER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)^(?:
            no(?:pe|ah)? | wrong | incorrect | not\ quite | stop,
          | (?:that's|that\ is|this\ is|it's|it\ is)\ (?:wrong|incorrect|not\ right|not\ correct|not\ what\ i\ (?:asked|meant|wanted)(?:\ for)?)
          | (?:that's\ |that\ is\ )?not\ what\ i\ (?:asked|meant|wanted)(?:\ for)?
          | you're\ wrong | you\ are\ wrong
          | 不对 | 错了 | 你错了 | 搞错了 | 弄错了 | 写错了 | 用错了 | 改错了 | 不是这样 | 不是的 | 不是
        )(?:[\s,.:;!-]+|$)",
    )
    .expect("a valid pattern")
});

/// Leading words that carry no instruction of their own.
static DISCOURSE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)^(?:
            actually | wait | hmm+ | ok(?:ay)? | well | also | and | but | so | please | pls | plz
          | hey | oh | ah | sorry | again | then | btw | by\ the\ way | one\ more\ thing
          | 另外 | 还有 | 请 | 哦 | 嗯 | 那 | 其实 | 然后 | 好的 | 好 | 对了 | 顺便说一下 | 注意
        )(?:[\s,.:;!-]+|$)",
    )
    .expect("a valid pattern")
});

/// Sentences that dismiss something: nothing to learn, whatever else they say.
static DISMISSAL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)
            \b(?:don't|do\ not|dont)\ (?:worry|bother)\b
          | \bnever\ ?mind\b | \bno\ need\b | \bnot\ (?:needed|necessary|important)\b
          | \b(?:doesn't|does\ not)\ matter\b | \bforget\ (?:it|about\ it)\b | \bno\ worries\b
          | \bskip\ (?:it|that|this)\b | \bleave\ it\b | \bno\ problem\b
          | ^(?:no,?\ )?(?:that's|that\ is|it's|it\ is|this\ is|all)\ (?:fine|ok|okay|alright|good)\b
          | ^(?:fine|ok|okay|alright|whatever)\b[\s,.!]*$
          | 没关系 | 不用了 | 不用管 | 没事 | 无所谓 | 不要紧 | 先不管 | 先不用 | 不必了 | 不用担心 | 别担心 | 不要担心
          | (?:^|[,.!;\s])算了
        ",
    )
    .expect("a valid pattern")
});

static QUESTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)
            \?\s*$
          | ^(?:should|shall|can|could|would|will|do|does|did|is|are|was|were|have|has|may|might|must|am)\s+(?:we|i|you|it|this|that|there|they|he|she|these|those)\b
          | ^(?:why|how|what|where|when|which|who|whom|whose)\b
          | 吗[\s.。!]*$ | 呢[\s.。!]*$ | 要不要 | 是不是 | 能不能 | 可不可以 | 会不会 | 有没有 | 为什么 | 怎么 | 什么 | 哪个 | 哪里
        ",
    )
    .expect("a valid pattern")
});

/// Explicit all-work phrasing ("in all my projects", 所有项目). A bare "everywhere" is not: "rename
/// it everywhere" means this code base.
static ALL_WORK: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)
            \b(?:in|for|across|on)\ (?:all|every|each|any)\ (?:of\ )?(?:my\ |our\ )?(?:projects?|repos?|repositories|codebases?|conversations?|chats?)\b
          | \bregardless\ of\ (?:the\ )?(?:project|repo)\b | \ball\ my\ (?:projects|repos|work)\b | \bwhatever\ the\ project\b
          | 所有项目 | 所有的项目 | 任何项目 | 每个项目 | 所有仓库 | 无论哪个项目 | 不管哪个项目
        ",
    )
    .expect("a valid pattern")
});

/// Personal communication preferences: reply language and tone.
static COMMUNICATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)
            \b(?:answer|reply|respond|talk|write|speak|communicate)s?\ (?:to\ me\ )?(?:only\ )?in\ (?:english|chinese|mandarin|german|french|spanish|japanese|korean|russian|portuguese)\b
          | \b(?:be|keep\ (?:it|answers|replies|explanations|responses))\ (?:more\ )?(?:concise|brief|terse|short)(?:\ in\ (?:your\ )?(?:answers|replies|responses|explanations))?[.!]?\s*$
          | \b(?:keep\ (?:answers|replies|explanations|responses))\ (?:more\ )?(?:concise|brief|terse|short)\b | \bno\ emojis?\b | \bdon't\ apologi[sz]e\b
          | \b(?:too|way\ too|so)\ (?:verbose|long-winded|wordy)\b | \bless\ verbose\b | \bno\ preamble\b
          | 用(?:中文|英文|英语|汉语|日语)(?:来)?(?:回答|回复|交流|说|写|沟通|对话)
          | (?:回答|回复|对话|交流)(?:都|一律|请)?(?:用|使用)(?:中文|英文|英语|汉语|日语)
          | 语气 | 回答简短 | 回复简短 | 简短点 | 简短一点 | 别啰嗦 | 不要啰嗦 | 少废话
        ",
    )
    .expect("a valid pattern")
});

/// Either of the above: a user-wide lesson.
fn user_wide(folded: &str) -> bool {
    ALL_WORK.is_match(folded) || COMMUNICATION.is_match(folded)
}

/// One pattern: a regex anchored at the start of a clause, what it means, and how to write its
/// lesson from the named groups.
struct Pattern {
    regex: Regex,
    action: Action,
    lesson: Lesson,
    /// Only after a correction marker ("No, use pnpm"; "不对，是 pnpm").
    needs_marker: bool,
}

#[derive(Clone, Copy)]
enum Lesson {
    /// "Use {x} {connector} {y}."
    UseInsteadOf,
    /// "Use {x} instead."
    UseInstead,
    /// "Use {x}."
    UseX,
    /// The clause itself from the group `rule` on.
    Clause,
    /// The clause after the marker (group `rest`).
    Rest,
    /// "Prefer {rest}."
    Prefer,
    /// Undo the previous turn (group `rest` holds the reason).
    Undo,
    /// The previous turn broke {x}.
    Broke,
    /// "You should have {verb-ed} …" → the base verb.
    ShouldHave,
    /// "{x}, not {y}": "Use {x}, not {y}." when short, else the clause.
    XNotY,
}

struct Durability {
    /// Words in the matched trigger that make the rule durable.
    words: &'static [&'static str],
}

static PATTERNS: LazyLock<Vec<(Pattern, Durability)>> = LazyLock::new(|| {
    let p = |pattern: &str, action, lesson, needs_marker, words: &'static [&'static str]| {
        (
            Pattern {
                regex: Regex::new(pattern).expect("a valid pattern"),
                action,
                lesson,
                needs_marker,
            },
            Durability { words },
        )
    };
    use Action::*;
    const ALWAYS: &[&str] = &[
        "always",
        "never",
        "from now on",
        "going forward",
        "in the future",
        "remember",
        "以后",
        "今后",
        "从现在",
        "记住",
        "记得",
        "统一",
        "一律",
        "永远",
        "每次",
        "总是",
        "务必",
        "绝对",
    ];
    vec![
        // English.
        p(
            r"^(?:please |just )?(?P<rule>(?:always |only )?use (?P<x>.+?),? (?P<conn>instead of|rather than|in place of|over|not) (?P<y>.+))$",
            Correction,
            Lesson::UseInsteadOf,
            false,
            ALWAYS,
        ),
        p(
            r"^(?:please |just )?(?P<rule>(?:always |only )?use (?P<x>.+?),? (?:instead|rather))$",
            Correction,
            Lesson::UseInstead,
            false,
            ALWAYS,
        ),
        p(
            r"^(?P<rule>instead of (?P<y>.+?),? (?:please )?use (?P<x>.+))$",
            Correction,
            Lesson::UseInsteadOf,
            false,
            ALWAYS,
        ),
        p(
            r"^(?:please |just )?(?P<rule>(?:don't|do not|dont|never|stop|avoid|quit) (?P<rest>.+))$",
            Correction,
            Lesson::Clause,
            false,
            ALWAYS,
        ),
        p(
            r"^(?:please |just )?(?P<rule>always (?P<rest>.+))$",
            Preference,
            Lesson::Clause,
            false,
            ALWAYS,
        ),
        p(
            r"^(?:from now on|going forward|in the future|in future|henceforth|from here on)[,: ]+(?P<rest>.+)$",
            Preference,
            Lesson::Rest,
            false,
            ALWAYS,
        ),
        p(
            r"^(?P<rest>.+?),? (?:from now on|going forward|in the future|in future)$",
            Preference,
            Lesson::Rest,
            false,
            &["from now on", "going forward", "in the future", "in future"],
        ),
        p(
            r"^(?:please )?remember(?: that| to|:|,)? (?P<rest>.+)$",
            Preference,
            Lesson::Rest,
            false,
            &["remember"],
        ),
        p(
            r"^(?:i|we) (?:prefer|would rather|'d rather|'d prefer|would prefer) (?:to )?(?P<rest>.+)$",
            Preference,
            Lesson::Prefer,
            false,
            ALWAYS,
        ),
        p(
            r"^(?:please )?prefer (?P<rest>.+)$",
            Preference,
            Lesson::Prefer,
            false,
            ALWAYS,
        ),
        p(
            r"^(?:i|we) (?P<rule>always (?P<rest>.+))$",
            Preference,
            Lesson::Clause,
            false,
            ALWAYS,
        ),
        p(
            r"^(?:i|we) use (?P<x>.+)$",
            Preference,
            Lesson::UseX,
            false,
            &[],
        ),
        p(
            r"^(?:please )?(?:undo|revert|roll back|rollback|back out)\b(?P<rest>.*)$",
            Rejection,
            Lesson::Undo,
            false,
            &[],
        ),
        p(
            r"^(?:you|it|that|this|the last change|your (?:last )?change|that change|this change) (?:just )?(?:broke|breaks|has broken|have broken|messed up|ruined|destroyed) (?P<x>.+)$",
            Rejection,
            Lesson::Broke,
            false,
            &[],
        ),
        p(
            r"^(?:you should have|you should've|you were supposed to|you needed to|you had to) (?P<rest>.+)$",
            Correction,
            Lesson::ShouldHave,
            false,
            &[],
        ),
        p(
            r"^(?:it's|it is|it should be|should be|that should be|the right one is|the correct (?:one|answer|command|way) is|we use|use) (?P<x>.+)$",
            Correction,
            Lesson::UseX,
            true,
            &[],
        ),
        p(
            r"^(?P<rule>(?P<x>[^,]+?), not (?P<y>[^,]+?)(?:,? (?:because|since|as|so that) .+)?)$",
            Correction,
            Lesson::XNotY,
            false,
            &[],
        ),
        // Chinese (punctuation is folded to ASCII by now).
        p(
            r"^(?:以后|今后|从现在开始|从现在起|从今以后|往后)(?P<rest>.+)$",
            Preference,
            Lesson::Clause,
            false,
            ALWAYS,
        ),
        p(
            r"^(?:请)?(?:记住|记得|请记住)[,:\s]*(?P<rest>.+)$",
            Preference,
            Lesson::Rest,
            false,
            ALWAYS,
        ),
        p(
            r"^(?P<rule>(?:你|请|千万|以后|永远|绝对)?(?:不要|别|不许|禁止|切勿|不准)(?P<rest>.+))$",
            Correction,
            Lesson::Clause,
            false,
            ALWAYS,
        ),
        p(
            r"^(?P<rule>(?:请)?(?:用|使用|改用|换用)(?P<x>.+?)(?:代替|替代|替换)(?P<y>.+))$",
            Correction,
            Lesson::Clause,
            false,
            ALWAYS,
        ),
        p(
            r"^(?P<rule>.+?而不是.+)$",
            Correction,
            Lesson::Clause,
            false,
            ALWAYS,
        ),
        p(
            r"^(?P<rule>(?:应该用|应该使用|应该是|统一用|统一使用|统一|一律用|一律|要用|请用|请使用)(?P<rest>.+))$",
            Correction,
            Lesson::Clause,
            false,
            ALWAYS,
        ),
        // "改成 X" alone is usually a task ("把按钮改成蓝色"); after "不对，" it corrects.
        p(
            r"^(?P<rule>(?:改成|改为|换成|换用|改用)(?P<rest>.+))$",
            Correction,
            Lesson::Clause,
            true,
            ALWAYS,
        ),
        p(
            r"^(?P<rule>(?:每次都|每次|一定先|一定要|务必|总是|永远)(?P<rest>.+))$",
            Preference,
            Lesson::Clause,
            false,
            ALWAYS,
        ),
        p(
            r"^(?:请)?(?:撤销|撤回|回滚|还原|退回|恢复)(?P<rest>.*)$",
            Rejection,
            Lesson::Undo,
            false,
            &[],
        ),
        p(
            r"^(?:你)?(?:把)?(?P<x>.*?)(?:改坏了|弄坏了|搞坏了|搞乱了|弄乱了|改乱了)(?P<rest>.*)$",
            Rejection,
            Lesson::Broke,
            false,
            &[],
        ),
        p(
            r"^(?:应该是|应该用)(?P<x>.+)$",
            Correction,
            Lesson::Clause,
            true,
            &[],
        ),
    ]
});

/// Time words that make an instruction about this task only ("don't apply the changes yet",
/// "skip the e2e tests for now", "这次先不用"): nothing for later sessions.
static ONE_OFF: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)\b(?:for\ now|yet|this\ time|right\ now|at\ the\ moment|for\ today|just\ this\ once|for\ this\ (?:one|release|pr|task|commit|change))\b
          | 这次 | 这一次 | 暂时",
    )
    .expect("a valid pattern")
});

/// Words after "don't"/"never" that make a statement, not an instruction ("I don't know").
static NOT_IMPERATIVE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)^(?:don't|do\ not|dont|never|stop|avoid|quit)\ (?:know|think|understand|see|get|remember|forget|have|need|care|mind|like|want|worry|bother|really|seem|work|works|mean)\b
          | ^(?:不要|别)(?:管|担心|着急|在意|客气|紧)
          | ^别(?:人|的|处|名|称|墅)",
    )
    .expect("a valid pattern")
});

/// What follows "it's" after "No," when it is a state, not the right answer ("No, it's still
/// broken").
static NOT_ARGUMENT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:not|still|broken|working|fine|ok|okay|good|bad|better|worse|the same|too|very|really|just|already|done|it|that|this)\b")
        .expect("a valid pattern")
});

/// Chinese markers that make a sentence an instruction wherever they stand (after the topic).
static ZH_INNER_MARKER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"应该用|应该使用|统一用|统一使用|一律用|一定先|一定要|每次都|以后都|务必|而不是|不要再|别再")
        .expect("a valid pattern")
});

/// Chinese markers that open a later comma clause ("分页要走后端，别在前端切片").
static ZH_CLAUSE_MARKER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:千万)?(?:不要|别|不许|禁止|切勿|不准)").expect("a valid pattern")
});

/// Chinese words that make an instruction durable.
static ZH_DURABLE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"以后|今后|记住|统一|一律|永远|每次|总是|务必").expect("a valid pattern")
});

/// English markers that open a later clause of a sentence.
static EN_CLAUSE_MARKER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(?:always|never|don't|do not)\b").expect("a valid pattern"));

/// "X, not Y" idioms that are not corrections ("not sure", "not yet").
static NOT_IDIOM: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:sure|yet|now|really|quite|exactly|much|bad|only|just|always|working|work|all|even|that|this|too|so)\b")
        .expect("a valid pattern")
});

impl Reader<'_> {
    /// The instruction in sentence `range` (folded), if any, and whether the next sentence was
    /// used (a bare "That's wrong." takes its argument from the sentence after it; a reason
    /// sentence after a rule is kept with it).
    fn sentence(
        &self,
        range: Range<usize>,
        next: Option<&Range<usize>>,
    ) -> Option<(Instruction, bool)> {
        let text = &self.folded.text;
        let whole = &text[range.clone()];
        let said = |pattern: &Regex| {
            pattern
                .find_iter(whole)
                .any(|m| self.own(range.start + m.start()))
        };
        if said(&DISMISSAL) || said(&ONE_OFF) {
            return None;
        }
        let mut clause = range.clone();
        let mut corrected = false;
        loop {
            let rest = &text[clause.clone()];
            if let Some(found) = CORRECTION_MARKER.find(rest)
                && self.own(clause.start)
            {
                corrected = true;
                clause.start += found.end();
            } else if let Some(found) = DISCOURSE.find(rest)
                && self.own(clause.start)
                && found.end() > 0
            {
                clause.start += found.end();
            } else {
                break;
            }
            if clause.start >= clause.end {
                break;
            }
        }
        let core = self.core(clause.clone());
        if core.is_empty() {
            // "That's wrong." — the argument is in the next sentence.
            if corrected && let Some(next) = next {
                let (mut instruction, _) = self.clause(next.clone(), true, next)?;
                instruction.cite = self.folded.original(range.start..next.end);
                return Some((instruction, true));
            }
            return None;
        }
        if QUESTION.is_match(&text[range.clone()]) || QUESTION.is_match(&text[core.clone()]) {
            return None;
        }
        let (mut instruction, _) = self
            .clause(core.clone(), corrected, &range)
            .or_else(|| self.inner_clause(core.clone(), corrected, &range))
            .or_else(|| self.communication_preference(core.clone(), &range))?;
        instruction.user_wide = user_wide(whole);
        // A reason in the next sentence stays with the rule ("Use pnpm. It keeps the lockfile
        // consistent.").
        if let Some(next) = next
            && is_reason(&text[next.clone()])
        {
            let reason = self.display(next.clone());
            instruction.lesson = format!("{} {}", instruction.lesson, finish(&reason));
            instruction.cite = self.folded.original(range.start..next.end);
            return Some((instruction, true));
        }
        Some((instruction, false))
    }

    /// An instruction that does not open the sentence: Chinese puts the topic first ("日志统一用
    /// slog，别再引入 zap"), so a strong Chinese marker anywhere, or a marker opening a later
    /// comma clause, makes the whole sentence the lesson; in English a later clause (after `,`
    /// or `;`) that opens with "always", "never" or "don't" is the lesson ("complete the commit,
    /// always run the hooks").
    fn inner_clause(
        &self,
        core: Range<usize>,
        corrected: bool,
        sentence: &Range<usize>,
    ) -> Option<(Instruction, bool)> {
        let text = &self.folded.text;
        let clause = &text[core.clone()];
        let chinese = clause.chars().any(fold::is_cjk);
        if chinese {
            let marked = ZH_INNER_MARKER
                .find_iter(clause)
                .any(|m| self.own(core.start + m.start()))
                || clause
                    .match_indices(',')
                    .map(|(at, _)| core.start + at + 1)
                    .any(|start| {
                        let rest = text[start..core.end].trim_start();
                        let at = core.end - rest.len();
                        self.own(at)
                            && (ZH_CLAUSE_MARKER.is_match(rest)
                                || (corrected && rest.starts_with("不是")))
                            && !NOT_IMPERATIVE.is_match(rest)
                    });
            if !marked {
                return None;
            }
            let durable = ZH_DURABLE.is_match(clause);
            return Some((
                Instruction {
                    action: Action::Correction,
                    lesson: finish(&self.display(core)),
                    cite: self.folded.original(sentence.clone()),
                    durable,
                    user_wide: false,
                    reference: None,
                },
                false,
            ));
        }
        let separators = clause
            .match_indices(", ")
            .chain(clause.match_indices("; "))
            .map(|(at, _)| at);
        for at in separators {
            let start = core.start + at + 2;
            let rest = &text[start..core.end];
            if EN_CLAUSE_MARKER.is_match(rest)
                && rest.split_whitespace().count() >= 3
                && self.own(start)
                && let Some(found) = self.clause(start..core.end, corrected, sentence)
            {
                return Some(found);
            }
        }
        None
    }

    /// A personal communication preference stated without a marker ("Keep explanations short:
    /// bullet points, no preamble."): reply language and tone hold for all the user's work.
    fn communication_preference(
        &self,
        core: Range<usize>,
        sentence: &Range<usize>,
    ) -> Option<(Instruction, bool)> {
        let found = COMMUNICATION.find(&self.folded.text[core.clone()])?;
        if !self.own(core.start + found.start()) {
            return None;
        }
        Some((
            Instruction {
                action: Action::Preference,
                lesson: finish(&capitalize(&self.display(core))),
                cite: self.folded.original(sentence.clone()),
                durable: true,
                user_wide: true,
                reference: None,
            },
            false,
        ))
    }

    /// Matches the patterns against `core` (folded, without markers and terminators).
    fn clause(
        &self,
        core: Range<usize>,
        corrected: bool,
        sentence: &Range<usize>,
    ) -> Option<(Instruction, bool)> {
        let text = &self.folded.text;
        let core = self.core(core);
        let clause = &text[core.clone()];
        if clause.is_empty() || !self.own(core.start) || QUESTION.is_match(clause) {
            return None;
        }
        for (pattern, durability) in PATTERNS.iter() {
            if pattern.needs_marker && !corrected {
                continue;
            }
            let Some(captures) = pattern.regex.captures(clause) else {
                continue;
            };
            if NOT_IMPERATIVE.is_match(clause) && matches!(pattern.lesson, Lesson::Clause) {
                continue;
            }
            let groups = Groups {
                captures,
                offset: core.start,
            };
            let argument = groups.get("x").or(groups.get("rest"));
            let trigger = &text[core.start..argument.map_or(core.end, |r| r.start)];
            let durable = durability.holds(trigger, clause);
            let lesson = match self.word_lesson(pattern.lesson, &groups, &core)? {
                Worded::Lesson(lesson) => lesson,
                Worded::NextPattern => continue,
            };
            let reference = self.reference(pattern.lesson, &groups)?;
            return Some((
                Instruction {
                    action: pattern.action,
                    lesson: if lesson.is_empty() {
                        lesson
                    } else {
                        finish(&capitalize(&lesson))
                    },
                    cite: self.folded.original(sentence.clone()),
                    durable,
                    user_wide: false,
                    reference,
                },
                false,
            ));
        }
        None
    }

    /// The lesson a pattern words from its match (empty for the references to the previous
    /// turn, which carry no lesson). `None`: a group the wording needs did not match, and the
    /// clause is no instruction at all.
    fn word_lesson(&self, kind: Lesson, groups: &Groups, core: &Range<usize>) -> Option<Worded> {
        let text = &self.folded.text;
        let lesson = match kind {
            Lesson::UseInsteadOf => {
                let (x, y) = (groups.get("x")?, groups.get("y")?);
                let connector = connector(groups.text("conn"));
                format!("Use {}{connector} {}", self.display(x), self.display(y))
            }
            Lesson::UseInstead => format!("Use {} instead", self.display(groups.get("x")?)),
            Lesson::UseX => {
                let x = groups.get("x")?;
                if text[x.clone()].split_whitespace().count() > 8
                    || NOT_ARGUMENT.is_match(&text[x.clone()])
                {
                    return Some(Worded::NextPattern);
                }
                format!("Use {}", self.display(x))
            }
            Lesson::Clause => self.display(groups.get("rule").unwrap_or(core.clone())),
            Lesson::Rest => {
                let rest = groups.get("rest")?;
                let rest = strip_words(text, rest, &["to ", "that "]);
                self.display(rest)
            }
            Lesson::Prefer => format!("Prefer {}", self.display(groups.get("rest")?)),
            Lesson::Undo => String::new(),
            Lesson::Broke => String::new(),
            Lesson::ShouldHave => {
                let rest = groups.get("rest")?;
                should_have(&self.display(rest))
            }
            Lesson::XNotY => {
                let (x, y) = (groups.get("x")?, groups.get("y")?);
                if NOT_IDIOM.is_match(&text[y.clone()])
                    || text[y.clone()].split_whitespace().count() > 6
                {
                    return Some(Worded::NextPattern);
                }
                if text[x.clone()].split_whitespace().count() <= 3 {
                    format!("Use {}, not {}", self.display(x), self.display(y))
                } else {
                    self.display(core.clone())
                }
            }
        };
        Some(Worded::Lesson(lesson))
    }

    /// What a pattern's match says about the previous turn, if anything. `None`: the match
    /// names nothing the reference needs, and the clause is no instruction at all.
    fn reference(&self, kind: Lesson, groups: &Groups) -> Option<Option<Reference>> {
        Some(match kind {
            Lesson::Undo => {
                let reason = groups
                    .get("rest")
                    .and_then(|rest| undo_reason(&self.folded.text, rest))
                    .map(|reason| self.display(reason));
                Some(Reference::Undo { reason })
            }
            Lesson::Broke => {
                let what = groups
                    .get("x")
                    .filter(|x| !x.is_empty())
                    .or(groups.get("rest"))?;
                if what.is_empty() {
                    return None;
                }
                Some(Reference::Broke {
                    what: self.display(what),
                })
            }
            Lesson::UseInstead => Some(Reference::Instead {
                replacement: self.display(groups.get("x")?),
            }),
            _ => None,
        })
    }

    /// Whether the byte at `at` (folded) is the user's own words.
    fn own(&self, at: usize) -> bool {
        !self.prose.is_literal(at)
    }

    /// `range` without surrounding whitespace and trailing terminators.
    fn core(&self, range: Range<usize>) -> Range<usize> {
        let text = &self.folded.text;
        let Some(mut range) = fold::trim(text, range.clone()) else {
            return range.end..range.end;
        };
        while let Some(c) = text[range.clone()].chars().next_back() {
            if matches!(c, '.' | '!' | ';' | '。' | ',' | ':' | ' ' | '-') {
                range.end -= c.len_utf8();
            } else {
                break;
            }
        }
        while let Some(c) = text[range.clone()].chars().next() {
            if matches!(c, ',' | ':' | ';' | ' ' | '-') {
                range.start += c.len_utf8();
            } else {
                break;
            }
        }
        range
    }

    /// The original text behind a folded range, folded for display (case kept), trimmed.
    fn display(&self, range: Range<usize>) -> String {
        let original = self.folded.original(range);
        let text = fold::display(&self.original[original]);
        text.trim()
            .trim_end_matches(['.', '!', ',', ';', ':', '。', ' '])
            .to_owned()
    }
}

/// What a pattern's wording made of its match.
enum Worded {
    Lesson(String),
    /// The match is not one this pattern words (an argument too long, an idiom); a later
    /// pattern may word it.
    NextPattern,
}

/// One pattern's named groups, as ranges of the whole folded text (the pattern ran on a clause
/// starting at `offset`).
struct Groups<'t> {
    captures: regex::Captures<'t>,
    offset: usize,
}

impl Groups<'_> {
    fn get(&self, name: &str) -> Option<Range<usize>> {
        self.captures
            .name(name)
            .map(|m| self.offset + m.start()..self.offset + m.end())
    }

    fn text(&self, name: &str) -> Option<&str> {
        self.captures.name(name).map(|m| m.as_str())
    }
}

impl Durability {
    /// Whether the rule holds beyond this task: a durability word in the trigger (the words
    /// before the argument), or at either end of the clause.
    fn holds(&self, trigger: &str, clause: &str) -> bool {
        self.words.iter().any(|word| {
            trigger.contains(word) || clause.starts_with(word) || clause.ends_with(word)
        })
    }
}

/// How "use x … y" joins its two arguments in the lesson: "over" reads as "instead of", and
/// "not" takes a comma ("Use pnpm, not npm").
fn connector(matched: Option<&str>) -> String {
    let connector = matched.unwrap_or("instead of");
    let connector = if connector == "not" {
        ", not"
    } else if connector == "over" {
        "instead of"
    } else {
        connector
    };
    if connector == ", not" {
        String::from(", not")
    } else {
        format!(" {connector}")
    }
}

/// Whether a sentence gives the reason for the one before it.
fn is_reason(sentence: &str) -> bool {
    const STARTS: [&str; 9] = [
        "because",
        "since ",
        "it keeps",
        "otherwise",
        "that way",
        "that's why",
        "因为",
        "否则",
        "这样",
    ];
    STARTS.iter().any(|start| sentence.starts_with(start))
}

/// The reason after "undo that": what follows `that`/`the last change`/… and a connector.
fn undo_reason(text: &str, rest: Range<usize>) -> Option<Range<usize>> {
    const OBJECTS: [&str; 16] = [
        "the last change",
        "your last change",
        "the last edit",
        "the last commit",
        "the change",
        "those changes",
        "these changes",
        "your changes",
        "what you did",
        "that",
        "this",
        "it",
        "刚才的修改",
        "上次的修改",
        "刚才的改动",
        "上一次修改",
    ];
    const CONNECTORS: [&str; 9] = [
        "because", "since", "as", "it", "that", "因为", "它", "这", "-",
    ];
    let mut range = rest;
    let skip_space = |range: &mut Range<usize>| {
        while text[range.clone()].starts_with([' ', ',', ':', '-', ';']) {
            range.start += 1;
        }
    };
    skip_space(&mut range);
    if let Some(object) = OBJECTS.iter().find(|o| text[range.clone()].starts_with(*o)) {
        range.start += object.len();
    }
    skip_space(&mut range);
    if let Some(connector) = CONNECTORS.iter().find(|c| {
        text[range.clone()].starts_with(&format!("{c} "))
            || (!c.is_ascii() && text[range.clone()].starts_with(*c))
    }) && !matches!(*connector, "it" | "that" | "它" | "这")
    {
        range.start += connector.len();
    }
    skip_space(&mut range);
    (range.start < range.end).then_some(range)
}

/// Drops one of `words` at the start of `range`.
fn strip_words(text: &str, mut range: Range<usize>, words: &[&str]) -> Range<usize> {
    for word in words {
        if text[range.clone()].starts_with(word) {
            range.start += word.len();
            break;
        }
    }
    range
}

/// "used pnpm" → "Use pnpm"; other participles keep "You should have".
fn should_have(rest: &str) -> String {
    const VERBS: [(&str, &str); 12] = [
        ("used ", "Use "),
        ("run ", "Run "),
        ("asked ", "Ask "),
        ("checked ", "Check "),
        ("added ", "Add "),
        ("written ", "Write "),
        ("kept ", "Keep "),
        ("read ", "Read "),
        ("tested ", "Test "),
        ("called ", "Call "),
        ("created ", "Create "),
        ("installed ", "Install "),
    ];
    let lower = rest.to_lowercase();
    for (participle, verb) in VERBS {
        if lower.starts_with(participle) {
            return format!("{verb}{}", &rest[participle.len()..]);
        }
    }
    format!("You should have {rest}")
}

/// First letter upper case (ASCII only: other scripts have no case or keep theirs).
pub fn capitalize(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) if first.is_ascii_lowercase() => {
            format!("{}{}", first.to_ascii_uppercase(), chars.as_str())
        }
        _ => text.to_owned(),
    }
}

/// Trims and ends with one terminator: `。` for a sentence with CJK in it, else `.`.
pub fn finish(text: &str) -> String {
    let core = text
        .trim()
        .trim_end_matches(['.', '!', ',', ';', ':', '。', '，', '！', ' ']);
    if core.is_empty() {
        String::new()
    } else if core.chars().any(fold::is_cjk) {
        format!("{core}。")
    } else {
        format!("{core}.")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lessons(text: &str) -> Vec<String> {
        instructions(text).into_iter().map(|i| i.lesson).collect()
    }

    fn one(text: &str) -> Instruction {
        let mut found = instructions(text);
        assert_eq!(found.len(), 1, "{text}: {found:?}");
        found.remove(0)
    }

    #[test]
    fn the_seven_probes() {
        for nothing in [
            "warning: comparison of unsigned expression in '>= 0' is always true [-Wtype-limits]",
            "No, don't worry about the flaky test for now.",
            "Should we always use pnpm here?",
            "程序出错了，帮我看看",
        ] {
            assert_eq!(instructions(nothing), [], "{nothing}");
        }
        let yarn = one("Use yarn instead.");
        assert_eq!(yarn.lesson, "Use yarn instead.");
        assert_eq!(
            yarn.reference,
            Some(Reference::Instead {
                replacement: "yarn".into()
            })
        );
        let pnpm = one("That\u{2019}s wrong \u{2014} it's pnpm.");
        assert_eq!(pnpm.lesson, "Use pnpm.");
        assert_eq!(pnpm.action, Action::Correction);
        let never = one("Never run migrations on prod.");
        assert_eq!(never.lesson, "Never run migrations on prod.");
        assert!(never.durable);
    }

    #[test]
    fn english_imperatives_with_arguments() {
        assert_eq!(lessons("No, use pnpm, not npm"), ["Use pnpm, not npm."]);
        assert_eq!(
            lessons("use pnpm instead of npm because the lockfile is pnpm-lock.yaml"),
            ["Use pnpm instead of npm because the lockfile is pnpm-lock.yaml."]
        );
        assert_eq!(
            lessons("Instead of curl, use the http client in lib/net."),
            ["Use the http client in lib/net instead of curl."]
        );
        assert_eq!(
            lessons("Actually, always run cargo fmt before committing."),
            ["Always run cargo fmt before committing."]
        );
        assert_eq!(
            lessons("From now on, run the tests with nextest"),
            ["Run the tests with nextest."]
        );
        assert_eq!(
            lessons("Remember to bump the version in Cargo.toml"),
            ["Bump the version in Cargo.toml."]
        );
        assert_eq!(
            lessons("I prefer tabs over spaces"),
            ["Prefer tabs over spaces."]
        );
        assert_eq!(
            lessons("Stop adding comments to every line."),
            ["Stop adding comments to every line."]
        );
        assert_eq!(
            lessons("You should have used the staging database."),
            ["Use the staging database."]
        );
        assert_eq!(
            lessons("Thanks! But that's wrong: use the staging DB"),
            ["Use the staging DB."]
        );
        assert_eq!(
            lessons("That's wrong. It should be the v2 endpoint."),
            ["Use the v2 endpoint."]
        );
        assert_eq!(
            lessons("Use pnpm. It keeps the lockfile consistent."),
            Vec::<String>::new()
        );
        assert_eq!(
            lessons("No, use pnpm. It keeps the lockfile consistent."),
            ["Use pnpm. It keeps the lockfile consistent."]
        );
        assert!(one("always answer in English, in all my projects").user_wide);
        assert!(!one("Always run the linter").user_wide);
    }

    #[test]
    fn previous_turn_references() {
        let undo = one("undo the last change it messed up the dark highlight");
        assert_eq!(undo.action, Action::Rejection);
        assert_eq!(
            undo.reference,
            Some(Reference::Undo {
                reason: Some("it messed up the dark highlight".into())
            })
        );
        let broke = one("You broke the login page.");
        assert_eq!(
            broke.reference,
            Some(Reference::Broke {
                what: "the login page".into()
            })
        );
        assert_eq!(
            one("revert that").reference,
            Some(Reference::Undo { reason: None })
        );
    }

    #[test]
    fn chinese_markers_are_words() {
        assert_eq!(lessons("不对，应该用 pnpm 安装。"), ["应该用 pnpm 安装。"]);
        assert_eq!(
            lessons("以后都用中文回答，代码注释和 commit message 还是用英文"),
            ["以后都用中文回答,代码注释和 commit message 还是用英文。"]
        );
        assert!(one("以后都用中文回答，代码注释和 commit message 还是用英文").user_wide);
        assert!(one("记住：提交前先运行 cargo fmt").durable);
        assert_eq!(lessons("别用 npm，用 pnpm"), ["别用 npm,用 pnpm。"]);
        for nothing in [
            "这个布局不对称",
            "我计算了一下，结果是 42",
            "要不要加个缓存？",
            "没关系，先这样吧",
            "不用了，谢谢",
            "程序出错了",
            "是不是错了？",
            "别人的代码不要动吗",
        ] {
            assert_eq!(instructions(nothing), [], "{nothing}");
        }
        assert_eq!(lessons("错了，应该用 yarn"), ["应该用 yarn。"]);
        assert_eq!(instructions("错了，是右上角，你放到左边去了。"), []);
    }

    #[test]
    fn questions_dismissals_and_quotes_are_not_rules() {
        for nothing in [
            "Can you use yarn instead",
            "no, that's fine",
            "don't bother with the docs",
            "the README says \"never use npm\"",
            "what does `always` do here",
            "I don't know why it fails",
            "It works, not sure why",
            "How to do 'export GEMINI_API_KEY=...' in fish?",
            "see https://example.com/never-use-this",
            "Thanks, looks good",
        ] {
            assert_eq!(instructions(nothing), [], "{nothing}");
        }
    }
}
