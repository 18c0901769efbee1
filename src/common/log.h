// Structured logging over spdlog: a message plus key/value fields (sandbox
// id, reason, ...). In text format the fields are appended as " k=v"; in JSON
// format (SetupLogging(kJson)) every line is one JSON object
// {"ts","level","msg",<fields>}, including lines logged with plain spdlog
// calls by other components.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include <spdlog/spdlog.h>

#include "common/status.h"

namespace warren {

enum class LogFormat { kText, kJson };

using LogField = std::pair<std::string, std::string>;

// Installs the formatter on the default logger and sets the level
// ("trace".."critical", "off"). InvalidArgument for an unknown level.
Status SetupLogging(LogFormat format, const std::string& level);

void Log(spdlog::level::level_enum level, const std::string& msg, std::initializer_list<LogField> fields = {});

}  // namespace warren
