#!/usr/bin/env bash
# Bazel workspace status: the commit a binary was built from, for tandem_build_info.
commit="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="${commit}-dirty"
fi
echo "STABLE_GIT_COMMIT ${commit}"
