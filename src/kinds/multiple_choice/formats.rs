//! The task files `llama-perplexity` reads, read and written byte for byte
//! as it reads them: its binary multiple-choice file, HellaSwag's text,
//! WinoGrande's CSV, and JSONL tasks; the tool's own draw of a subset.

use super::*;

/// Read llama-perplexity's binary multiple-choice file: `u32` task count,
/// `u32` byte offset of each task, then per task the question (`u32`
/// length + bytes) and two answer sets (`u32` count ≤ 100, the strings,
/// `i32` labels); only the first set is scored. Tasks in file order, or
/// `tasks` of them drawn as the tool draws them (mt19937 seeded 1).
pub fn read_binary(bytes: &[u8], tasks: usize, shown: &str) -> Result<Vec<(usize, Task)>> {
    let bad = |what: String| Error::input(format!("{shown}: {what}"));
    let u32_at = |at: usize, what: &str| -> Result<u32> {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| {
                bad(format!(
                    "{what} at byte {at}: the file ends at byte {}",
                    bytes.len()
                ))
            })
    };
    let n_task = u32_at(0, "task count")? as usize;
    if n_task == 0 {
        return Err(bad("no tasks (task count 0)".into()));
    }
    if 4 + 4 * n_task > bytes.len() {
        return Err(bad(format!(
            "{n_task} tasks claimed, but {} bytes cannot hold their offsets (not a --multiple-choice file?)",
            bytes.len()
        )));
    }
    let offsets: Vec<usize> = (0..n_task)
        .map(|i| u32_at(4 + 4 * i, "task offset").map(|o| o as usize))
        .collect::<Result<_>>()?;
    let read_task = |i: usize, mut at: usize| -> Result<(Task, usize)> {
        let ctx = |w: &str| format!("task {i}: {w}");
        let string = |at: &mut usize, w: &str| -> Result<String> {
            let n = u32_at(*at, &ctx(w))? as usize;
            let s = bytes.get(*at + 4..*at + 4 + n).ok_or_else(|| {
                bad(format!(
                    "{} of {n} bytes at byte {}: the file ends first",
                    ctx(w),
                    *at
                ))
            })?;
            *at += 4 + n;
            String::from_utf8(s.to_vec())
                .map_err(|_| bad(format!("{} at byte {}: not UTF-8", ctx(w), *at - n)))
        };
        let question = string(&mut at, "question")?;
        let mut sets = Vec::new();
        for set in ["mc1", "mc2"] {
            let n = u32_at(at, &ctx(&format!("{set} answer count")))? as usize;
            if n > 100 {
                return Err(bad(ctx(&format!(
                    "{set} has {n} answers, more than the tool's 100"
                ))));
            }
            at += 4;
            let answers: Vec<String> = (0..n)
                .map(|j| string(&mut at, &format!("{set} answer {j}")))
                .collect::<Result<_>>()?;
            let labels: Vec<i32> = (0..n)
                .map(|j| u32_at(at + 4 * j, &ctx(&format!("{set} label {j}"))).map(|v| v as i32))
                .collect::<Result<_>>()?;
            at += 4 * n;
            sets.push((answers, labels));
        }
        let (choices, labels) = sets.swap_remove(0);
        Ok((
            Task {
                question,
                choices,
                labels,
            },
            at,
        ))
    };
    let order: Vec<usize> = if tasks == 0 || tasks >= n_task {
        (0..n_task).collect()
    } else {
        tool_selection(n_task, tasks)
    };
    let mut out = Vec::new();
    if order.len() == n_task {
        // All tasks: read one after another from the end of the offsets, as the tool does.
        let mut at = 4 + 4 * n_task;
        for i in 0..n_task {
            let (t, next) = read_task(i, at)?;
            out.push((i, t));
            at = next;
        }
    } else {
        for i in order {
            out.push((i, read_task(i, offsets[i])?.0));
        }
    }
    for (i, t) in &out {
        let why = if t.question.is_empty() {
            Some("an empty question".to_string())
        } else if t.choices.len() < 2 {
            Some(format!(
                "{} choice(s); a task needs at least 2",
                t.choices.len()
            ))
        } else if let Some(j) = t.choices.iter().position(String::is_empty) {
            Some(format!("choice {j} is empty"))
        } else if !t.labels.contains(&1) {
            Some("no choice is labelled correct (1)".to_string())
        } else {
            None
        };
        if let Some(why) = why {
            return Err(bad(format!("task {i}: {why}")));
        }
    }
    Ok(out)
}

/// The tasks llama-perplexity draws for `--multiple-choice-tasks k` out of
/// `n`: mt19937 seeded 1, `j = (int)(scale · rng() · left)` in float, swap
/// with the last.
pub(crate) fn tool_selection(n: usize, k: usize) -> Vec<usize> {
    let mut rng = Mt19937::new(1);
    let mut aux: Vec<usize> = (0..n).collect();
    let scale = 1.0f32 / (1.0f32 + u32::MAX as f32);
    (0..k)
        .map(|_| {
            let j = (scale * rng.next() as f32 * aux.len() as f32) as usize;
            let idx = aux[j];
            let last = aux.len() - 1;
            aux[j] = aux[last];
            aux.pop();
            idx
        })
        .collect()
}

/// Read llama-perplexity's HellaSwag file: 6 lines per task (the context,
/// the gold ending's index, 4 endings). `tasks` of them (all when fewer),
/// drawn as the tool draws them: each the `uniform_int_distribution` pick
/// (libstdc++'s) of mt19937(1) among those left, then removed.
pub fn read_hellaswag(bytes: &[u8], tasks: usize, shown: &str) -> Result<Vec<(usize, Task)>> {
    let bad = |what: String| Error::input(format!("{shown}: {what}"));
    let text = std::str::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    let mut lines: Vec<&str> = text.split('\n').collect();
    // std::getline: a final newline ends the last line, it does not start one.
    if lines.last() == Some(&"") {
        lines.pop();
    }
    if lines.is_empty() || !lines.len().is_multiple_of(6) {
        return Err(bad(format!(
            "{} lines, not a positive multiple of 6 (a --hellaswag file has 6 lines per task)",
            lines.len()
        )));
    }
    let mut left: Vec<(usize, &[&str])> = lines.chunks(6).enumerate().collect();
    let n = tasks.min(left.len());
    let mut rng = Mt19937::new(1);
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let j = uniform_below(&mut rng, left.len() as u32) as usize;
        let (i, t) = left.remove(j);
        let gold: usize = t[1].trim().parse().ok().filter(|g| *g < 4).ok_or_else(|| {
            bad(format!(
                "task {i} (line {}): gold ending `{}` is not 0, 1, 2 or 3",
                6 * i + 2,
                t[1]
            ))
        })?;
        if t[0].is_empty() {
            return Err(bad(format!(
                "task {i} (line {}): an empty context",
                6 * i + 1
            )));
        }
        if let Some(k) = t[2..].iter().position(|e| e.is_empty()) {
            return Err(bad(format!(
                "task {i} (line {}): ending {k} is empty",
                6 * i + 3 + k
            )));
        }
        out.push((
            i,
            Task {
                question: t[0].to_string(),
                choices: t[2..].iter().map(|e| e.to_string()).collect(),
                labels: (0..4).map(|k| i32::from(k == gold)).collect(),
            },
        ));
    }
    Ok(out)
}

/// Read llama-perplexity's WinoGrande CSV: per line `index,sentence,choice1,choice2,answer`
/// (the sentence quoted when it holds commas, one `_` where a choice goes,
/// the answer 1 or 2), split at the first four commas outside quotes as the
/// tool splits it. A line the tool would skip (not four commas, no `_`, an
/// answer not 1 or 2) or leave out (the last line, unless an empty line
/// ends the file) is an error here, naming the line. `tasks` of them (0: all) drawn as
/// `--winogrande-tasks` draws them.
pub fn read_winogrande(
    bytes: &[u8],
    tasks: usize,
    shown: &str,
) -> Result<Vec<(usize, Winogrande)>> {
    let bad = |what: String| Error::input(format!("{shown}: {what}"));
    let text = std::str::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    // `-f` drops one final newline; the tool's reader then stops at the line
    // that reaches the end of the text, leaving it out: only an empty last
    // line (a file ending in a blank line) leaves none out.
    let text = text.strip_suffix('\n').unwrap_or(text);
    let mut lines: Vec<&str> = text.split('\n').collect();
    match lines.pop() {
        Some("") | None => {}
        Some(last) => {
            return Err(bad(format!(
            "line {}: `{last}`: llama-perplexity leaves out the last line of a --winogrande file \
                 unless the file ends with an empty line; add one, so that every task counts",
            lines.len() + 1
        )))
        }
    }
    let mut all = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let at = |what: &str| bad(format!("line {}: {what}", n + 1));
        let b = line.as_bytes();
        let mut commas = Vec::new();
        let mut quoted = false;
        for (i, &c) in b.iter().enumerate() {
            if !quoted && c == b',' {
                commas.push(i);
                if commas.len() == 4 {
                    break;
                }
            } else if c == b'"' {
                quoted = !quoted;
            }
        }
        if commas.len() != 4 {
            return Err(at(
                "not 5 comma-separated fields (index,sentence,choice1,choice2,answer)",
            ));
        }
        let sub = |a: usize, len: usize| line.get(a..a + len).ok_or_else(|| at("a field is cut"));
        let sentence = if b.get(commas[0] + 1) == Some(&b'"') {
            sub(commas[0] + 2, (commas[1] - commas[0]).saturating_sub(3))?
        } else {
            sub(commas[0] + 1, commas[1] - commas[0] - 1)?
        };
        let choice1 = sub(commas[1] + 1, commas[2] - commas[1] - 1)?;
        let choice2 = sub(commas[2] + 1, commas[3] - commas[2] - 1)?;
        let answer = &line[commas[3] + 1..];
        let Some(blank) = sentence.find('_') else {
            return Err(at("the sentence has no `_` where a choice goes"));
        };
        // `stream >> int`: leading blanks, then a number; trailing text ignored.
        let digits: String = answer
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '-' || *c == '+')
            .collect();
        let answer: i32 = match digits.parse() {
            Ok(a @ 1..=2) => a,
            _ => return Err(at(&format!("answer `{answer}` is not 1 or 2"))),
        };
        all.push(Winogrande {
            first: sentence[..blank].to_string(),
            second: sentence[blank + 1..].to_string(),
            choices: [choice1.to_string(), choice2.to_string()],
            answer,
        });
    }
    drawn(all, tasks, &bad)
}

/// One WinoGrande task: the sentence around the blank, the two choices,
/// the answer (1 or 2).
#[derive(Debug, Clone, PartialEq)]
pub struct Winogrande {
    /// The sentence before the blank.
    pub first: String,
    /// The sentence after the blank.
    pub second: String,
    /// The two choices.
    pub choices: [String; 2],
    /// 1 or 2.
    pub answer: i32,
}

impl Winogrande {
    /// As a [`Task`]: the sentence with a blank, the choices, the labels.
    pub(crate) fn task(&self) -> Task {
        Task {
            question: format!("{}_{}", self.first, self.second),
            choices: self.choices.to_vec(),
            labels: vec![i32::from(self.answer == 1), i32::from(self.answer == 2)],
        }
    }
}

/// Read our own task format: one JSON object per line (blank lines
/// skipped), `question` (a string), `choices` (at least 2 strings),
/// `answer` (the index of the correct choice, from 0); `tasks` of them
/// (0: all) drawn as `--multiple-choice-tasks` draws them. Every problem is
/// an error naming the line.
pub(crate) fn read_jsonl(bytes: &[u8], tasks: usize, shown: &str) -> Result<Vec<(usize, Task)>> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Line {
        question: String,
        choices: Vec<String>,
        answer: usize,
    }
    let bad = |what: String| Error::input(format!("{shown}: {what}"));
    let text = std::str::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    let mut all = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = |what: String| bad(format!("line {}: {what}", n + 1));
        let l: Line = serde_json::from_str(line).map_err(|e| at(e.to_string()))?;
        if l.choices.len() < 2 {
            return Err(at(format!(
                "{} choice(s); a task needs at least 2",
                l.choices.len()
            )));
        }
        if l.answer >= l.choices.len() {
            return Err(at(format!(
                "answer {} is out of range: choices count from 0 to {}",
                l.answer,
                l.choices.len() - 1
            )));
        }
        if l.question.is_empty() || l.choices.iter().any(String::is_empty) {
            return Err(at("an empty question or choice".into()));
        }
        all.push(Task {
            question: l.question,
            labels: (0..l.choices.len())
                .map(|k| i32::from(k == l.answer))
                .collect(),
            choices: l.choices,
        });
    }
    drawn(all, tasks, &bad)
}

/// `tasks` of `all` (0: every one, in order) drawn as the tool's
/// `--multiple-choice-tasks` / `--winogrande-tasks` draw them, with their
/// indices; no task at all is an error.
pub(crate) fn drawn<T: Clone>(
    all: Vec<T>,
    tasks: usize,
    bad: &dyn Fn(String) -> Error,
) -> Result<Vec<(usize, T)>> {
    if all.is_empty() {
        return Err(bad("no tasks".into()));
    }
    let order: Vec<usize> = if tasks == 0 || tasks >= all.len() {
        (0..all.len()).collect()
    } else {
        tool_selection(all.len(), tasks)
    };
    Ok(order.into_iter().map(|i| (i, all[i].clone())).collect())
}

/// Write tasks in the binary format [`read_binary`] reads (and
/// llama-perplexity's `--multiple-choice`), with an empty second answer set.
pub fn write_binary(tasks: &[Task]) -> Vec<u8> {
    let mut body: Vec<Vec<u8>> = Vec::new();
    for t in tasks {
        let mut b = Vec::new();
        let s = |b: &mut Vec<u8>, x: &str| {
            b.extend((x.len() as u32).to_le_bytes());
            b.extend(x.as_bytes());
        };
        s(&mut b, &t.question);
        b.extend((t.choices.len() as u32).to_le_bytes());
        for c in &t.choices {
            s(&mut b, c);
        }
        for l in &t.labels {
            b.extend(l.to_le_bytes());
        }
        b.extend(0u32.to_le_bytes());
        body.push(b);
    }
    let mut out = Vec::new();
    out.extend((tasks.len() as u32).to_le_bytes());
    let mut at = 4 + 4 * tasks.len();
    for b in &body {
        out.extend((at as u32).to_le_bytes());
        at += b.len();
    }
    for b in body {
        out.extend(b);
    }
    out
}

/// Write 4-choice tasks as a `--hellaswag` file (6 lines per task).
pub fn write_hellaswag(tasks: &[Task]) -> Result<String> {
    let mut out = String::new();
    for (i, t) in tasks.iter().enumerate() {
        let gold = t.labels.iter().position(|l| *l == 1);
        let clean = |s: &str| !s.contains('\n');
        match gold {
            Some(g)
                if t.choices.len() == 4
                    && clean(&t.question)
                    && t.choices.iter().all(|c| clean(c)) =>
            {
                out.push_str(&format!("{}\n{g}\n{}\n", t.question, t.choices.join("\n")));
            }
            _ => {
                return Err(Error::input(format!(
                    "task {i}: a --hellaswag task has 4 one-line endings and one gold one"
                )))
            }
        }
    }
    Ok(out)
}
