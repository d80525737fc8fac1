//! Text and user-message events: monologues and repeated turns; what a person's message
//! resets; a reset.

use super::*;

impl Session {
    pub(super) fn on_text(&mut self, t: &Text<'_>) -> Verdict {
        let rules = Arc::clone(&self.rules);
        let p = &rules.config.detectors;
        let end = !t.chunk || t.end_of_turn;
        let ts = self.text.get_or_insert_with(Box::default);
        let occasion = TEXT_OCCASION | ts.turn_no.wrapping_add(1);
        // Reasoning is only scanned for chanting: it is not a turn of its own.
        if !t.reasoning {
            ts.turn.feed(t.text);
        }
        let mut chant = None;
        if p.chanting.enabled {
            let ch = ts.chant.get_or_insert_with(Box::default);
            chant = ch.feed(t.text, &p.chanting);
            if end || (t.reasoning && !t.chunk) {
                chant = chant.or(ch.end(&p.chanting));
                // Idle sessions keep no text buffers.
                ts.chant = None;
            }
        }
        let chanting = chant
            .map(|(key, count)| Detection::new(Det::Chanting, key, count, p.chanting.threshold));
        let mut cands = [None, None, chanting];
        // Narration beside calls is not a turn without action, nor a repeated turn: the calls
        // are judged, not the words.
        if end && !t.reasoning {
            ts.turn_no = ts.turn_no.wrapping_add(1);
        }
        if end && !t.reasoning && !t.narration {
            let (digest, chars) = ts.turn.take();
            ts.monologue = ts.monologue.saturating_add(1);
            // Turns each answered by the same automated reply (a framework failing or
            // rejecting them the same way) are flagged sooner: the agent is told the same thing
            // and says something else that changes nothing.
            let threshold = if ts.same_replies.saturating_add(1) >= p.monologue.same_reply_threshold
            {
                p.monologue.threshold.min(p.monologue.same_reply_threshold)
            } else {
                p.monologue.threshold
            };
            if p.monologue.enabled && ts.monologue >= threshold {
                cands[0] = Some(Detection::new(
                    Det::Monologue,
                    0x6d6f_6e6f,
                    ts.monologue,
                    threshold,
                ));
            }
            // Empty turns count too: nothing said again, each answered by a host prompt.
            if p.text_repeat.enabled && (chars >= p.text_repeat.min_chars || chars == 0) {
                let seen = ts.turns[..ts.turns_len]
                    .iter()
                    .filter(|&&d| d == digest)
                    .count() as u32;
                ts.turns[ts.turns_next] = digest;
                ts.turns_next = (ts.turns_next + 1) % TURNS;
                ts.turns_len = (ts.turns_len + 1).min(TURNS);
                if seen + 1 >= p.text_repeat.threshold {
                    cands[1] = Some(Detection::new(
                        Det::TextRepeat,
                        digest,
                        seen + 1,
                        p.text_repeat.threshold,
                    ));
                }
            }
        }
        if end && t.narration {
            ts.turn = TurnText::default();
        }
        let now = self.rel(t.time_ms);
        let hits = rules.plugins.on_text(t, &self.window(now));
        self.escalate(&rules, &cands, hits, None, occasion, None, now)
            .0
    }

    pub(super) fn on_user(&mut self, u: &UserMessage<'_>) -> Verdict {
        let user = &self.rules.config.user;
        // The same words as the last message judged a person's: a framework's fixed prompt
        // sent with every step, its reply rejecting each turn the same way (a check failing
        // alike), or a person pasting again what changed nothing. Other short messages are
        // left out: a person answers "go" or "yes" to each question.
        let text = u.text.trim();
        let rejects = &self.rules.config.detectors.monologue.reject_patterns;
        let rejecting = any_match(rejects, text);
        // Said again is judged as a tool's output is, once noise is masked: a counter or a
        // clock in it (`Attempt 2 failed validation`) makes it no other message.
        // The message's digest as a tool's output (`is_error`: as a failure, by its signature).
        let masked = |is_error: bool| {
            self.rules
                .results
                .outcome(&ToolResult {
                    session: u.session,
                    call_id: "",
                    output: text,
                    is_error,
                    exit_code: (!is_error).then_some(0),
                    time_ms: u.time_ms,
                })
                .digest
        };
        let digest = if said_again_length(text) || rejecting {
            masked(false) | 1
        } else {
            0
        };
        let again = digest != 0 && digest == self.last_user;
        if u.injected || again || any_match(&user.automated_patterns, u.text) {
            // A rejection is known as a tool's failure is, by its signature once noise is
            // masked and what a host adds is dropped: a clock or a cost in the reply makes it
            // no other rejection. A framework's fixed prompt to go on (a sentence of
            // instruction at least, or one the host marks as its own) is known by its masked
            // text: turns without a tool call each answered by the same one are an agent that
            // neither acts nor ends. A bare `continue` may be a person's, reading a long answer
            // in parts: it is no such reply.
            let reply = if rejecting {
                Some(masked(true))
            } else if digest != 0 {
                Some(digest)
            } else if u.injected {
                Some(masked(false) | 1)
            } else {
                None
            };
            if let Some(ts) = &mut self.text
                && again
                && ts.ended_by_person > 0
            {
                // The first sending was the host's too: the turns it ended count again, and
                // it was the same reply to them.
                ts.monologue = ts.monologue.saturating_add(ts.ended_by_person);
                ts.ended_by_person = 0;
                if let Some(reply) = reply {
                    ts.reply = reply;
                    ts.same_replies = 1;
                }
            }
            // A reply to a turn without a tool call: the same one as the last such reply
            // counts towards `monologue.same_reply_threshold`.
            if let Some(ts) = &mut self.text {
                if let Some(reply) = reply.filter(|_| ts.monologue > 0) {
                    ts.same_replies = if ts.same_replies > 0 && reply == ts.reply {
                        ts.same_replies.saturating_add(1)
                    } else {
                        1
                    };
                    ts.reply = reply;
                } else {
                    ts.same_replies = 0;
                }
            }
            return Verdict::allow();
        }
        self.last_user = digest;
        if let Some(ts) = &mut self.text {
            let ended = ts.monologue;
            ts.end_turn();
            ts.ended_by_person = ended;
        }
        let allowance = allowance(user, u.text);
        let retry = user.retry_requests.iter().any(|re| {
            super::ends(u.text, USER_END_BYTES).iter().any(|part| {
                re.find_iter(part)
                    .take(MAX_REQUEST_MATCHES)
                    .any(|m| !negated(part, m.start()))
            })
        });
        if self.rules.config.time.reset_on_user_message {
            // The calls so far are set aside; their loops keep their escalation unless the
            // person asked for a retry or for repetitions. A refusal decided on a result is
            // dropped: the person may have changed what the next call will find.
            self.user_seq = self.seq;
            self.user_turn = if retry || allowance > 0 {
                self.loops.clear();
                UserTurn::Final
            } else {
                UserTurn::Pending
            };
            self.armed = None;
        }
        self.allowance = allowance;
        Verdict::allow()
    }

    pub(super) fn reset_all(&mut self) {
        self.clear_window();
        self.loops.clear();
        self.seq = 0;
        self.has_epoch = false;
        self.ids.clear();
        self.flags = 0;
        self.allowance = 0;
        if let Some(text) = &mut self.text {
            text.end_turn();
            text.forget_turns();
        }
        self.unknown.clear();
        self.armed = None;
        self.user_seq = 0;
        self.user_turn = UserTurn::Open;
        self.files.clear();
        self.last_user = 0;
        if let Some(m) = self.group.as_deref_mut() {
            m.loops.clear();
        }
    }
}

/// Extra repeats a user message asks for: the number it names, else the policy's allowance;
/// 0 when it asks for no repetition.
pub(crate) fn allowance(user: &loopguard_rules::config::User, text: &str) -> u32 {
    // "Don't read it again and again", "you keep polling": a request not to repeat, or a
    // complaint about repeating, asks for no repetition.
    let Some(m) = user.repeat_requests.iter().find_map(|re| {
        super::ends(text, USER_END_BYTES)
            .into_iter()
            .find_map(|part| {
                re.find_iter(part)
                    .take(MAX_REQUEST_MATCHES)
                    .find(|m| !negated(part, m.start()))
            })
    }) else {
        return 0;
    };
    let s = m.as_str();
    // "5 times" names a count; "every 5 seconds" names an interval.
    let times = s.to_ascii_lowercase().contains("time");
    let digits: String = s.chars().filter(char::is_ascii_digit).collect();
    if times && let Ok(n) = digits.parse::<u32>() {
        return n;
    }
    const WORDS: &[(&str, u32)] = &[
        ("once", 1),
        ("twice", 2),
        ("thrice", 3),
        ("two", 2),
        ("three", 3),
        ("four", 4),
        ("five", 5),
        ("six", 6),
        ("seven", 7),
        ("eight", 8),
        ("nine", 9),
        ("ten", 10),
    ];
    s.split(|c: char| !c.is_alphabetic())
        .find_map(|w| {
            WORDS
                .iter()
                .find(|(name, _)| w.eq_ignore_ascii_case(name))
                .map(|&(_, n)| n)
        })
        .unwrap_or(user.repeat_allowance)
}

/// Matches of one request pattern looked at in each end of a message.
const MAX_REQUEST_MATCHES: usize = 16;

/// Bytes of a user message read from each end by the user patterns (`user.*`,
/// `monologue.reject_patterns`): a person's request and a framework's prompt stand at the start
/// or the end of a message; what a long one holds between (a pasted log, a file) is not read,
/// so the work per message is bounded however long it is.
const USER_END_BYTES: usize = 4096;

/// Whether a pattern matches either end of a user message ([`USER_END_BYTES`]).
fn any_match(patterns: &[regex::Regex], text: &str) -> bool {
    let [first, last] = super::ends(text, USER_END_BYTES);
    patterns
        .iter()
        .any(|re| re.is_match(first) || (!last.is_empty() && re.is_match(last)))
}

/// How far back from a request the clause it belongs to is searched for a negation.
const CLAUSE_BYTES: usize = 80;

/// Whether the request found at `at` in `text` is negated or a complaint: its clause (back to
/// the last sentence end, comma or line break, at most [`CLAUSE_BYTES`]) says `don't`, `do
/// not`, `never`, `stop`, `no more`, `without`, `instead of`, … before it, or blames the agent
/// for repeating (`you keep`, `you've been`, `why do you`), unless it asks (`can you keep
/// polling`).
pub(crate) fn negated(text: &str, at: usize) -> bool {
    let mut from = at.saturating_sub(CLAUSE_BYTES);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    let before = &text[from..at.min(text.len())];
    // A sentence ends at `.`, `!`, `?`, `;` or `:` before a space (not inside `a.component.html`).
    let b = before.as_bytes();
    let cut = (0..b.len()).rev().find(|&i| match b[i] {
        b',' | b'\n' => true,
        b'.' | b'!' | b'?' | b';' | b':' => b.get(i + 1).is_none_or(u8::is_ascii_whitespace),
        _ => false,
    });
    let clause = cut.map_or(before, |i| &before[i + 1..]);
    let clause = clause.to_ascii_lowercase().replace(['\u{2019}', '\''], "'");
    let words: Vec<&str> = clause
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '\''))
        .filter(|w| !w.is_empty())
        .collect();
    const NOT: &[&str] = &[
        "not",
        "don't",
        "dont",
        "never",
        "stop",
        "quit",
        "avoid",
        "without",
        "no",
        "cannot",
        "can't",
        "won't",
        "shouldn't",
        "mustn't",
        "didn't",
        "doesn't",
        "instead",
    ];
    // "Why don't you run it again?", "why not retry" suggest, and "don't forget to run it
    // twice" asks: none forbids.
    let suggests = words
        .windows(2)
        .any(|p| p[0] == "why" && matches!(p[1], "don't" | "dont" | "not"))
        || words.contains(&"forget");
    if suggests {
        return false;
    }
    if words.iter().any(|w| NOT.contains(w) || w.ends_with("n't")) {
        return true;
    }
    const ASKING: &[&str] = &["can", "could", "would", "will", "please"];
    let blames = words.windows(2).any(|p| {
        matches!(
            (p[0], p[1]),
            ("you", "keep" | "kept" | "are" | "were" | "have" | "just")
                | ("you've" | "you're" | "youre" | "why", _)
        )
    });
    blames && !words.iter().any(|w| ASKING.contains(w))
}

/// Bytes and words a user message needs before its second sending in the same words is
/// judged a framework's fixed prompt: one sentence of instruction at least.
const SAID_AGAIN_MIN_BYTES: usize = 40;
const SAID_AGAIN_MIN_WORDS: usize = 6;

fn said_again_length(text: &str) -> bool {
    text.len() >= SAID_AGAIN_MIN_BYTES
        && text
            .split_whitespace()
            .nth(SAID_AGAIN_MIN_WORDS - 1)
            .is_some()
}
