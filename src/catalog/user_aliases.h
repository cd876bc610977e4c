// User aliases: short names of the user's own, kept in
// $XDG_CONFIG_HOME/tandem/aliases.json (default ~/.config/tandem/aliases.json)
// as {"aliases": {"NAME": "TARGET", ...}}.
//
// A TARGET is a Hugging Face repo "org/name[@revision]", a built-in alias,
// or an absolute folder path. A user alias never shadows a built-in or
// retired name: set_user_alias refuses one, and load_user_aliases skips
// (with a warning on stderr) one that a newer catalog has since taken.
// A malformed file is an error naming the file, never silently ignored.
#pragma once

#include <map>
#include <string>

#include "catalog/catalog.h"

namespace tandem::catalog {

std::string user_aliases_path();

// NAME -> TARGET; empty when the file does not exist.
std::map<std::string, std::string> load_user_aliases(const Catalog& builtin);

// Validates and writes (atomically). A relative folder target is stored as an
// absolute path. Throws tandem::Error with the reason.
void set_user_alias(const std::string& name, const std::string& target, const Catalog& builtin);

// Returns false when there was no such alias.
bool remove_user_alias(const std::string& name);

}  // namespace tandem::catalog
