// Numbers in metrics.jsonl. JSON has no NaN or infinity, and a line holding `nan` is not JSON (a
// resume's trim of the file, trainer/state.h, and every JSON reader would drop or reject it), so a
// value that is not finite is written as null; a skipped step's record also says "skipped": true
// (docs/training-and-data.md, "The default run"). Finite values keep 17 significant digits: they read back exactly.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

namespace pv {

// The JSON text of x: its shortest exact form with %.17g, or null when x is NaN or infinite.
inline std::string json_number(double x) {
    if (!std::isfinite(x)) return "null";
    char text[32];
    std::snprintf(text, sizeof text, "%.17g", x);
    return text;
}

}  // namespace pv
