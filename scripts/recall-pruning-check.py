#!/usr/bin/env python3
"""How often does recall put a quoted experience in its top 5, and what did pruning the full-text
query to its rarest terms cost?

An experiment behind docs/benchmarks-history.md ("Recall: `context` latency"), not part of the service.
It reads a database saved by the recall benchmark:

    target/release/zuno-recall-bench --backends sqlite --experiences 100000 --rounds 1 \
        --queries 50 --save-sqlite /tmp/recall
    python3 scripts/recall-pruning-check.py /tmp/recall/recall-100000.db

For 200 prompts built like the benchmark's title prompts ("why does <part of a stored title> fail
again? <words>") it reports how often the experience whose title was quoted is in the top 5 and
the top 40 of:

- the recall index (`recall::index::top`, what `context` ranks its candidates from), and the top 5
  after the final ranking (`retrieval::search`: the index's 40 reranked by verification, recency,
  use and feedback), computed by the benchmark binary in `--rank-cases` mode on the same prompts
  (ZUNO_RECALL_BENCH names the binary; default target/release/zuno-recall-bench);
- the project-scoped, bm25-ranked FTS5 query `context` ran before the index (same column
  weights, first 40), with all terms and with only the K rarest terms (document frequencies from
  an fts5vocab table): the earlier experiment, kept as the baseline.

Times are each query's p50/p99 in milliseconds (the index's include reading its posting lists
through the binary's own connection). Python's sqlite3 module, no other packages.
"""
import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import time

STOP = set("the a an to of and or in on for is it be with as at by this that from why does fail again".split())


def main(path: str) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.vocab USING fts5vocab(main, experience_fts, 'row')")
    rng = random.Random(1)
    projects = [r[0] for r in db.execute("SELECT id FROM project")]
    doc_freq: dict[str, int] = {}

    def frequencies(terms):
        missing = [t for t in terms if t not in doc_freq]
        if missing:
            found = dict(db.execute(
                "SELECT term, doc FROM temp.vocab WHERE term IN (%s)" % ",".join("?" * len(missing)), missing))
            for t in missing:
                doc_freq[t] = found.get(t, 0)
        return {t: doc_freq[t] for t in terms}

    def ranked(project, terms):
        scope = "p" + project.encode().hex()
        matcher = 'scope:"%s" AND {title summary resolution}: (%s)' % (
            scope, " OR ".join('"%s"' % t for t in terms))
        started = time.perf_counter()
        rows = db.execute(
            "SELECT rowid, -bm25(experience_fts, 0.0, 5.0, 2.0, 1.0) AS r FROM experience_fts "
            "WHERE experience_fts MATCH ? ORDER BY r DESC, rowid LIMIT 40", (matcher,)).fetchall()
        return (time.perf_counter() - started) * 1000, [r[0] for r in rows]

    cases = []
    while len(cases) < 200:
        project = rng.choice(projects)
        row = db.execute(
            "SELECT k.num, e.id, e.title FROM experience_record e JOIN experience_search_key k ON k.experience_id = e.id "
            "WHERE e.project_id = ? AND e.title NOT GLOB '*[一-龥]*' ORDER BY random() LIMIT 1", (project,)).fetchone()
        if not row:
            continue
        target, target_id, title = row
        words = title.lower().split(" ")
        keep = rng.randint((len(words) + 1) // 2, len(words))
        start = rng.randint(0, len(words) - keep)
        other = db.execute("SELECT summary FROM experience_record WHERE project_id = ? ORDER BY random() LIMIT 1",
                           (project,)).fetchone()[0].split(" ")
        prompt = "why does %s fail again? %s" % (" ".join(words[start:start + keep]), " ".join(other[:rng.randint(0, 8)]))
        terms = []
        for t in re.findall(r"[a-z0-9_]+", prompt.lower()):
            if t not in STOP and t not in terms:
                terms.append(t)
        cases.append((project, target, terms[:16], target_id, prompt))

    print("| ranking | target in top 5 | target in top 40 | query p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|")
    binary = os.environ.get("ZUNO_RECALL_BENCH", "target/release/zuno-recall-bench")
    db.close()
    lines = "".join(json.dumps({"project": c[0], "prompt": c[4]}) + "\n" for c in cases)
    ranked_by_index = subprocess.run([binary, "--rank-cases", path], input=lines, text=True,
                                     capture_output=True, check=True).stdout.splitlines()
    db = sqlite3.connect(path)
    db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.vocab USING fts5vocab(main, experience_fts, 'row')")
    index5 = index40 = search5 = 0
    times = []
    for case, line in zip(cases, ranked_by_index):
        answer = json.loads(line)
        index5 += case[3] in answer["index"][:5]
        index40 += case[3] in answer["index"]
        search5 += case[3] in answer["search"][:5]
        times.append(answer["ms"])
    times.sort()
    p50, p99 = times[len(times) // 2], times[int(0.99 * (len(times) - 1))]
    print("| recall index (what `context` ranks from) | %d / %d | %d / %d | %.2f | %.2f |" % (
        index5, len(cases), index40, len(cases), p50, p99))
    print("| recall index, then the final ranking | %d / %d | | | |" % (search5, len(cases)))
    for k in (None, 4, 6, 8):
        in5 = in40 = 0
        times = []
        for project, target, terms, _, _ in cases:
            if k is None:
                kept = terms
            else:
                freq = frequencies(terms)
                kept = sorted((t for t in terms if freq[t] > 0), key=lambda t: freq[t])[:k] or terms
            elapsed, ids = ranked(project, kept)
            times.append(elapsed)
            in5 += target in ids[:5]
            in40 += target in ids
        times.sort()
        label = "ranked FTS, all terms (up to 16)" if k is None else "ranked FTS, %d rarest terms" % k
        print("| %s | %d / %d | %d / %d | %.2f | %.2f |" % (
            label, in5, len(cases), in40, len(cases), times[len(times) // 2], times[int(0.99 * (len(times) - 1))]))


if __name__ == "__main__":
    main(sys.argv[1])
