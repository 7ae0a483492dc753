#!/usr/bin/env python3
"""Checks README.md and docs/*.md against the code:

- every relative link resolves to a file or folder of the repository, and
  a link to a heading (#anchor) of a Markdown page names one of its
  headings (GitHub's anchors);
- every `swarmctl COMMAND` the docs name is a command of the built swarmctl,
  and every --flag written after it (on the same line of a code block, with
  backslash continuations, or in the same inline code span) is one of that
  command's flags (as its --help prints them) or a common flag;
- every config field the docs name exists in proto/swarm.proto: the first
  column of the tables in docs/config.md, and the keys of every JSON job or
  site config in a code block.

    check_docs.py SOURCE_DIR SWARMCTL

Prints every problem with its file and line; exit 1 if there is any.
"""
import json
import os
import re
import subprocess
import sys

SRC, SWARMCTL = sys.argv[1], sys.argv[2]
problems = []


def problem(path, line, text):
    problems.append(f"{os.path.relpath(path, SRC)}:{line}: {text}")


def pages():
    yield os.path.join(SRC, "README.md")
    docs = os.path.join(SRC, "docs")
    for name in sorted(os.listdir(docs)):
        if name.endswith(".md"):
            yield os.path.join(docs, name)


def slug(heading):
    """GitHub's anchor of a heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found, fence = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                fence = not fence
            elif not fence and line.startswith("#"):
                found.add(slug(line.lstrip("#")))
    return found


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def check_links(path, lines):
    for number, line in lines:
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+://|^mailto:", target):
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (os.path.normpath(os.path.join(os.path.dirname(path),
                                                      file_part))
                        if file_part else path)
            if not os.path.exists(resolved):
                problem(path, number, f"link {target}: no such file")
                continue
            if anchor and resolved.endswith(".md") and \
                    anchor not in anchors(resolved):
                problem(path, number, f"link {target}: no heading #{anchor}")


def swarmctl_help():
    """{command: set of flags} and the common flags, from the program."""
    top = subprocess.run([SWARMCTL, "--help"], capture_output=True,
                         text=True, check=True).stdout
    commands = set(re.findall(r"^  swarmctl ([a-z0-9]+)", top, re.M))
    flags = {}
    for command in commands:
        text = subprocess.run([SWARMCTL, command, "--help"],
                              capture_output=True, text=True,
                              check=True).stdout
        flags[command] = set(re.findall(r"--[a-z0-9-]+", text))
    common = set(re.findall(r"--[a-z0-9-]+",
                            top[top.index("common:"):]))
    return commands, flags, common


# "swarmctl " and what follows, up to the next "swarmctl" on the line.
COMMAND = re.compile(r"\bswarmctl ((?:(?!\bswarmctl\b).)*)")


def command_texts(lines):
    """(line number, text after 'swarmctl ') of every swarmctl command line
    in code blocks and inline code spans."""
    fence, pending = False, None
    for number, line in lines:
        if line.startswith("```"):
            fence = not fence
            continue
        if fence:
            if pending is not None:
                pending[1] += " " + line
            else:
                for match in COMMAND.finditer(line):
                    if pending is not None:
                        yield tuple(pending)
                    pending = [number, match.group(1)]
            if pending is not None and not line.rstrip().endswith("\\"):
                yield tuple(pending)
                pending = None
            continue
        for span in re.findall(r"`([^`]*)`", line):
            for match in COMMAND.finditer(span):
                yield number, match.group(1)


def check_commands(path, lines, commands, flags, common):
    for number, text in command_texts(lines):
        words = text.split()
        if words:
            words[0] = words[0].rstrip(",;.:")
        if not words or not re.match(r"^[a-z][a-z0-9]*$", words[0]):
            continue  # "swarmctl --version", prose like "swarmctl's"
        command = words[0]
        if command not in commands:
            problem(path, number, f"swarmctl {command}: no such command")
            continue
        for flag in re.findall(r"(?<![\w-])--[a-z0-9-]+", text):
            if flag not in flags[command] and flag not in common:
                problem(path, number,
                        f"swarmctl {command} {flag}: no such flag")


def proto_fields():
    """{message name: set of field names} of proto/swarm.proto."""
    with open(os.path.join(SRC, "proto", "swarm.proto"),
              encoding="utf-8") as f:
        text = f.read()
    fields = {}
    for match in re.finditer(r"^message (\w+) \{(.*?)^\}", text, re.M | re.S):
        fields[match.group(1)] = set(re.findall(
            r"^\s+(?:repeated |optional )?[\w.]+(?:<[^>]*>)?\s+(\w+)\s*=\s*\d+",
            match.group(2), re.M))
    return fields


CONFIG_TYPES = {"JobConfig": {"sites": "SiteInfo"},
                "SiteConfig": {"learner": "LearnerConfig",
                               "trainer": "TrainerConfig"}}
FREE_MAPS = {"params", "env", "learner_params"}


def check_config_keys(path, number, obj, message, fields):
    for key, value in obj.items():
        if key not in fields[message]:
            problem(path, number, f"config field {key}: not a field of "
                                  f"swarm.v1.{message}")
            continue
        nested = CONFIG_TYPES.get(message, {}).get(key)
        if key in FREE_MAPS or nested is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict):
                check_config_keys(path, number, item, nested, fields)


def check_json_configs(path, lines, fields):
    fence, block, start = None, [], 0
    for number, line in lines:
        if line.startswith("```"):
            if fence is None:
                fence, block, start = line[3:].strip(), [], number
                continue
            if fence == "json":
                try:
                    obj = json.loads("\n".join(block))
                except ValueError:
                    obj = None
                if isinstance(obj, dict) and "job_id" in obj:
                    check_config_keys(path, start, obj, "JobConfig", fields)
                elif isinstance(obj, dict) and "listen_address" in obj:
                    check_config_keys(path, start, obj, "SiteConfig", fields)
            fence = None
        elif fence is not None:
            block.append(line)


def check_config_tables(fields):
    path = os.path.join(SRC, "docs", "config.md")
    section = None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.startswith("## Job config"):
                section = "JobConfig"
            elif line.startswith("## Site config"):
                section = "SiteConfig"
            if section is None or not line.startswith("| `"):
                continue
            for name in re.findall(r"`([\w.]+)`", line.split("|")[1]):
                message, parts = section, name.split(".")
                for part in parts[:-1]:
                    message = CONFIG_TYPES[message].get(part, part)
                if message not in fields or parts[-1] not in fields[message]:
                    problem(path, number, f"config field {name}: not a "
                                          f"field of swarm.v1.{section}")


def main():
    commands, flags, common = swarmctl_help()
    fields = proto_fields()
    count = 0
    for path in pages():
        with open(path, encoding="utf-8") as f:
            lines = list(enumerate(f.read().split("\n"), 1))
        check_links(path, lines)
        check_commands(path, lines, commands, flags, common)
        check_json_configs(path, lines, fields)
        count += 1
    check_config_tables(fields)
    for line in problems:
        print(line)
    if problems:
        print(f"FAIL: {len(problems)} problem(s) in README.md and docs/")
        return 1
    print(f"PASS: links, swarmctl commands and flags, config fields in "
          f"{count} pages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
