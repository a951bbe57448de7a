#!/bin/sh
echo "bazel coverage is not available in Tandem's offline build" >&2
exit 1
