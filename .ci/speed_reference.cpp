// The machine's speed, for reading CI's times: .ci/run compiles this file (g++ -O2, no compiler
// cache, nothing written) at its start and at its end, and prints the seconds beside its table.
// Its content is fixed on purpose: the same code and the same Debian compiler take the same work,
// so the seconds change only with the machine. On this project's 2-core VMs one commit's cold run
// took 41:40 one day and 27:05 another (docs/testing.md, "CI"): a step over its budget is a cost
// of the change only where this figure did not rise with it.
#include <algorithm>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    std::map<std::string, std::vector<int>> counts;
    for (int i = 1; i < argc; ++i) {
        std::smatch match;
        const std::string arg = argv[i];
        if (std::regex_search(arg, match, std::regex("([a-z]+)=([0-9]+)")))
            counts[match[1]].push_back(std::stoi(match[2]));
    }
    std::ostringstream out;
    for (auto& [key, values] : counts) {
        std::sort(values.begin(), values.end());
        out << key << values.size();
    }
    return int(out.str().size() % 2);
}
