// The bash completion script of shardctl (`shardctl completion bash`):
// commands, their fixed words (get workers|jobs, describe job), flags, and
// for job and worker arguments the ids and names the coordinator lists now
// (through shardctl itself, with the command line's --coordinator).
#ifndef SHARDLINE_CLIENT_BASH_COMPLETION_H_
#define SHARDLINE_CLIENT_BASH_COMPLETION_H_

#include <string>
#include <vector>

namespace shardline::client {

std::string BashCompletion(const std::vector<std::string>& flags);

}  // namespace shardline::client

#endif  // SHARDLINE_CLIENT_BASH_COMPLETION_H_
