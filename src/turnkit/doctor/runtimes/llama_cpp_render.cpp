// turnkit's llama.cpp renderer: llama.cpp's own Jinja runtime (common/jinja), driven as common/chat.cpp's
// common_chat_template_direct_apply_impl drives it: lexer -> parse_from_tokens -> caps_get; the messages' content
// normalized to what the template's caps say it reads (messages_inp_normalizer: a string made one text part for a
// template that reads only parts, parts joined for one that reads only strings); reasoning_effort applied through
// caps_apply_reasoning_effort; context + global_from_json -> runtime -> gather_string_parts. The per-family handlers
// of chat.cpp (tool-call formats, polyfills) are llama-server's, not the runtime's, and are left out.
//
// Protocol: one JSON object a line on stdin, {"template": TEXT, "context": OBJECT}; one JSON object a line on stdout,
// {"text": RENDER} or {"error": MESSAGE}. Built by turnkit (turnkit.doctor.runtimes.llama_cpp) against the sources of
// the llama-cpp-python sdist it pins.
#include "jinja/caps.h"
#include "jinja/lexer.h"
#include "jinja/parser.h"
#include "jinja/runtime.h"
#include "jinja/value.h"
#include "json.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>

// common/json.cpp asserts through ggml's abort; this program links no ggml, so it gives the one function itself.
extern "C" void ggml_abort(const char * file, int line, const char * fmt, ...) {
    va_list args;
    va_start(args, fmt);
    std::fprintf(stderr, "%s:%d: ", file, line);
    std::vfprintf(stderr, fmt, args);
    va_end(args);
    std::abort();
}

struct compiled_template {
    std::shared_ptr<jinja::program> program;
    jinja::caps caps;
};

// messages_inp_normalizer::normalize of common/chat.cpp (no media markers: turnkit's probes have none).
static common_json normalize_messages(const common_json & messages, const jinja::caps & caps) {
    bool only_string = caps.supports_string_content && !caps.supports_typed_content;
    bool only_typed  = !caps.supports_string_content && caps.supports_typed_content;
    if ((!only_string && !only_typed) || !messages.is_array()) {
        return messages;
    }
    common_json normalized = common_json::array();
    for (const auto & message : messages) {
        common_json copy = message;
        if (copy.contains("content")) {
            common_json & content = copy.at("content");
            if (only_typed && content.is_string()) {
                common_json part = common_json::object();
                part["type"] = std::string("text");
                part["text"] = content.get<std::string>();
                common_json parts = common_json::array();
                parts.push_back(part);
                content = parts;
            } else if (only_string && content.is_array()) {
                std::string text;
                for (const auto & part : content) {
                    if (part.value("type", "") != "text") {
                        continue;
                    }
                    if (!text.empty()) {
                        text += '\n';
                    }
                    text += part.value("text", "");
                }
                content = text;
            }
        }
        normalized.push_back(copy);
    }
    return normalized;
}

int main() {
    std::ios::sync_with_stdio(false);
    std::map<std::string, compiled_template> compiled;
    std::string line;
    while (std::getline(std::cin, line)) {
        common_json reply = common_json::object();
        try {
            common_json request = common_json::parse(line);
            std::string source = request.at("template").get<std::string>();
            auto found = compiled.find(source);
            if (found == compiled.end()) {
                jinja::lexer lexer;
                auto tokens = lexer.tokenize(source);
                auto program = std::make_shared<jinja::program>(jinja::parse_from_tokens(tokens));
                jinja::caps caps = jinja::caps_get(*program);
                found = compiled.emplace(source, compiled_template{program, caps}).first;
            }
            common_json context = request.at("context");
            if (context.contains("messages")) {
                context["messages"] = normalize_messages(context.at("messages"), found->second.caps);
            }
            jinja::context ctx(source);
            if (context.contains("reasoning_effort") && context.at("reasoning_effort").is_string() &&
                !context.at("reasoning_effort").get<std::string>().empty()) {
                jinja::caps_apply_reasoning_effort(ctx, context.at("reasoning_effort").get<std::string>());
            }
            jinja::global_from_json(ctx, context, false);
            jinja::runtime runtime(ctx);
            const jinja::value results = runtime.execute(*found->second.program);
            auto parts = jinja::runtime::gather_string_parts(results);
            reply["text"] = parts->as_string().str();
        } catch (const std::exception & exc) {
            reply["error"] = std::string(exc.what());
        }
        std::cout << reply.dump() << "\n" << std::flush;
    }
    return 0;
}
