#!/usr/bin/env python3
"""The job report in a real browser (issue 15).

Runs the local demo in --quick mode (3 sites, 3 rounds, real daemons and the
MLP on real data), which ends with `swarmctl report`, then renders the
report.html it wrote in headless Debian chromium: the DOM after the page's
scripts ran (--dump-dom) must show that they ran (data-ready) without an
error (window.onerror writes data-script-errors; chromium's console log is
checked for uncaught errors too), and every plot must hold the number of
points the job's data calls for (data-points, and data-rendered-points that
the page's script counted in the browser). A screenshot is kept under the
build tree and its path printed. Also checks that a report of a job no
site knows fails, naming the job and the sites asked.

  report_browser_test.py SOURCE_DIR BUILD_DIR

Exits 77 (ctest: skipped), saying why, where chromium is missing or cannot
start.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77


def skip(reason):
    print(f"SKIP: {reason}")
    sys.exit(SKIP)


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def chromium_command():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            break
    else:
        skip("no chromium on PATH (Debian package chromium; "
             "tests/install_deps.sh installs it)")
    command = [path, "--headless", "--disable-gpu", "--hide-scrollbars",
               "--no-first-run", "--disable-extensions",
               "--disable-dev-shm-usage", "--mute-audio",
               "--enable-logging=stderr", "--v=0"]
    if os.geteuid() == 0:
        command.append("--no-sandbox")  # Chromium refuses root otherwise.
    return command


def run_chromium(command, args, home, timeout=60):
    env = dict(os.environ, HOME=home)
    try:
        return subprocess.run(command + args, capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        fail(f"chromium did not finish within {timeout} s: {args}")


def attributes(tag):
    return dict(re.findall(r'([\w-]+)="([^"]*)"', tag))


def main():
    source, build = sys.argv[1], sys.argv[2]
    command = chromium_command()
    work = tempfile.mkdtemp(prefix="swarm-report-test-")
    try:
        home = os.path.join(work, "home")
        os.makedirs(home)
        probe = run_chromium(command, ["--dump-dom",
                                       "data:text/html,<p id=probe>ok</p>"],
                             home, timeout=30)
        if probe.returncode != 0 or "probe" not in probe.stdout:
            skip("chromium cannot run here: "
                 + (probe.stderr.strip().splitlines() or ["no output"])[-1])

        # A real job: the demo's quick mode, which writes the report.
        port = 21000 + (os.getpid() % 1500) * 10
        demo = subprocess.run(
            ["bash", os.path.join(source, "deploy/local/demo.sh"), "--quick",
             "--no-baselines", "--insecure", "--bin-dir", build,
             "--workspace", os.path.join(work, "demo"), "--base-port",
             str(port)],
            capture_output=True, text=True, timeout=600)
        if demo.returncode != 0:
            print(demo.stdout[-4000:], demo.stderr[-4000:])
            fail("demo.sh --quick failed")
        match = re.search(r"^job report: +(\S+)$", demo.stdout, re.M)
        if not match:
            print(demo.stdout[-2000:])
            fail("the demo did not print the report's path")
        html_path = match.group(1)
        report_dir = os.path.dirname(html_path)
        for name in ("report.html", "report.csv", "report.json"):
            if not os.path.exists(os.path.join(report_dir, name)):
                fail(f"the demo wrote no {name}")
        with open(os.path.join(report_dir, "report.json")) as f:
            data = json.load(f)
        rounds = data["rounds"]
        if len(rounds) != 3 or [r["round"] for r in rounds] != [0, 1, 2]:
            fail(f"expected rounds 0, 1, 2 in report.json, got "
                 f"{[r['round'] for r in rounds]}")
        sites = len(data["sites"])
        if sites != 3 or data["missing_sites"]:
            fail(f"expected 3 sites all answering: {data['sites']}")
        for r in rounds:
            if len(r["participants"]) != 3 or not r["aggregator"]:
                fail(f"round {r['round']}: {r}")
            if r["mean_metric"] is None or r["test_metric"] is None:
                fail(f"round {r['round']} lacks a metric: {r}")
            if r["bytes_sent"] == 0 or r["bytes_received"] == 0:
                fail(f"round {r['round']} moved no bytes: {r}")
        expected = {
            # mean, best so far and test metric: one point each per round.
            "learning-curve": 3 * len(rounds),
            "round-time": len(rounds),
            "aggregators": len(rounds),
            "participation": sites * len(rounds),
        }

        url = "file://" + os.path.abspath(html_path)
        dom = run_chromium(command, ["--dump-dom", url], home)
        if dom.returncode != 0:
            fail(f"chromium --dump-dom exited {dom.returncode}: "
                 f"{dom.stderr[-2000:]}")
        html_tag = re.search(r"<html[^>]*>", dom.stdout)
        if not html_tag:
            fail("no <html> element in the rendered DOM")
        root = attributes(html_tag.group(0))
        if "data-script-errors" in root:
            fail(f"script errors: {root['data-script-errors']}")
        if root.get("data-ready") != "1":
            fail("the page's script did not run to its end (no data-ready)")
        console_errors = [line for line in dom.stderr.splitlines()
                          if "CONSOLE" in line and
                          ("Uncaught" in line or "Error" in line)]
        if console_errors:
            fail(f"console errors: {console_errors}")
        plots = {}
        for tag in re.findall(r"<svg[^>]*class=\"plot\"[^>]*>", dom.stdout):
            a = attributes(tag)
            plots[a.get("id")] = a
        for plot, count in expected.items():
            if plot not in plots:
                fail(f"no plot {plot} in the page")
            a = plots[plot]
            if a.get("data-points") != str(count):
                fail(f"{plot}: data-points={a.get('data-points')}, "
                     f"expected {count}")
            if a.get("data-rendered-points") != str(count):
                fail(f"{plot}: the browser counted "
                     f"{a.get('data-rendered-points')} marks, expected {count}")
            print(f"{plot}: {count} points rendered")

        artifacts = os.path.join(build, "test-artifacts")
        os.makedirs(artifacts, exist_ok=True)
        shot = os.path.join(artifacts, "report_browser_test.png")
        if os.path.exists(shot):
            os.remove(shot)
        taken = run_chromium(command, [f"--screenshot={shot}",
                                       "--window-size=900,1900", url], home)
        if taken.returncode != 0 or not os.path.exists(shot):
            fail(f"no screenshot: {taken.stderr[-2000:]}")
        with open(shot, "rb") as f:
            png = f.read()
        if not png.startswith(b"\x89PNG") or len(png) < 20000:
            fail(f"the screenshot is not a plausible PNG ({len(png)} bytes)")
        shutil.copy(html_path, os.path.join(artifacts,
                                             "report_browser_test.html"))
        print(f"screenshot: {shot} ({len(png)} bytes)")

        # A job no site knows: a clear error naming it and the sites asked.
        job_path = os.path.join(work, "demo", "job.json")
        with open(job_path) as f:
            job = json.load(f)
        job["job_id"] = "no-such-job"
        with open(os.path.join(work, "unknown.json"), "w") as f:
            json.dump(job, f)
        unknown = subprocess.run(
            [os.path.join(build, "cli", "swarmctl"), "report", "--job",
             os.path.join(work, "unknown.json"), "--out",
             os.path.join(work, "unknown"), "--insecure",
             "--timeout-ms", "2000"],
            capture_output=True, text=True, timeout=60)
        if unknown.returncode == 0:
            fail("a report of a job no site knows succeeded")
        for needle in ["no site knows job no-such-job", "site-1", "site-2",
                       "site-3"]:
            if needle not in unknown.stderr:
                fail(f"the error does not say {needle!r}: {unknown.stderr}")
        print("unknown job: " + unknown.stderr.strip().splitlines()[-1])
        print("report_browser_test: ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
