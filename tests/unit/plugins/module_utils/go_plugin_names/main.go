// Copyright (c) gpuops.sandbox contributors
// GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
// SPDX-License-Identifier: GPL-3.0-or-later

// Reference oracle for the unit tests of plugins/module_utils/_plugin_names.py.
//
// It applies the sandbox device plugin's naming rules (as the project documents them) with Go's own
// bufio.Scanner, strings and regexp packages, so the tests can check that the Python port agrees with
// Go's string semantics on odd input. Standard library only.
//
// Protocol: one JSON request per line on stdin, one JSON response per line on stdout. Byte strings
// ([]byte fields) travel as base64, so invalid UTF-8 survives the round trip.
//
//	{"op": "load", "id": "x", "text": <b64>}                    -> {}
//	{"op": "device", "text_id": "x", "keys": [<b64>...]}        -> {"results": [<b64>...]}
//	{"op": "device_unscoped", "text_id": "x", "keys": [...]}    -> {"results": [...]}
//	{"op": "mdev", "text_id": "x", "keys": [<raw name file>]}   -> {"results": [<resource name>...]}
//	{"op": "profiles", "keys": [<creatable_vgpu_types file>]}   -> {"profiles": [[[id, <b64 resource>]...]...]}
//	{"op": "unicode"}                                           -> {"version", "upper", "spaces"}
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"unicode"
)

const resourcePrefix = "nvidia.com/"

var (
	spaceRun    = regexp.MustCompile(`\s+`)
	notNameChar = regexp.MustCompile(`[^a-zA-Z0-9_.]+`)
	profileLine = regexp.MustCompile(`^\s*([0-9]+)\s*:\s*(.+?)\s*$`)
)

type request struct {
	Op     string   `json:"op"`
	ID     string   `json:"id"`
	Text   []byte   `json:"text"`
	TextID string   `json:"text_id"`
	Keys   [][]byte `json:"keys"`
}

type response struct {
	Error    string     `json:"error,omitempty"`
	Results  [][]byte   `json:"results,omitempty"`
	Profiles [][][2]any `json:"profiles,omitempty"`
	Version  string     `json:"version,omitempty"`
	Upper    [][2]rune  `json:"upper,omitempty"`
	Spaces   []rune     `json:"spaces,omitempty"`
}

// clean turns the rest of a pci.ids device line into a resource name suffix.
func clean(rest string) string {
	name := strings.TrimSpace(rest)
	name = strings.ToUpper(name)
	name = strings.ReplaceAll(name, "/", "_")
	name = strings.ReplaceAll(name, ".", "_")
	name = spaceRun.ReplaceAllString(name, "_")
	return notNameChar.ReplaceAllString(name, "")
}

// deviceName: the NVIDIA vendor block is the lines after the first line starting with "10de"; in it
// comments are skipped, a line without a leading tab ends the block, and the first line starting
// with tab + key names the device. A scanner error (a line of 64 KiB or more) ends the input.
func deviceName(text []byte, key string) string {
	scanner := bufio.NewScanner(bytes.NewReader(text))
	inBlock := false
	for scanner.Scan() {
		if strings.HasPrefix(scanner.Text(), "10de") {
			inBlock = true
			break
		}
	}
	if !inBlock {
		return ""
	}
	prefix := "\t" + key
	for scanner.Scan() {
		line := scanner.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		if !strings.HasPrefix(line, "\t") {
			return ""
		}
		if strings.HasPrefix(line, prefix) {
			return clean(strings.TrimPrefix(line, prefix))
		}
	}
	return ""
}

// deviceNameUnscoped: older plugin images look at every trimmed line of the file.
func deviceNameUnscoped(text []byte, key string) string {
	scanner := bufio.NewScanner(bytes.NewReader(text))
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if line == "" || !strings.Contains(line, key) {
			continue
		}
		parts := strings.Split(line, key)
		if len(parts) != 2 {
			return ""
		}
		if parts[0] != "" {
			continue
		}
		return clean(parts[1])
	}
	return ""
}

// mdevResource: the raw mdev_type/name content, newlines trimmed, whitespace runs to "_", then looked up
// like a device ID; without a name the key itself is used.
func mdevResource(text []byte, raw []byte) string {
	key := spaceRun.ReplaceAllString(strings.Trim(string(raw), "\n"), "_")
	name := deviceName(text, key)
	if name == "" {
		name = key
	}
	return resourcePrefix + name
}

// profiles: creatable_vgpu_types content, trimmed, one "<id> : <name>" per line; the first name of an
// id wins. Pairs are listed in the order they were first seen.
func profiles(raw []byte) [][2]any {
	seen := map[string]bool{}
	result := [][2]any{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		match := profileLine.FindStringSubmatch(line)
		if match == nil || seen[match[1]] {
			continue
		}
		seen[match[1]] = true
		result = append(result, [2]any{match[1], []byte(resourcePrefix + spaceRun.ReplaceAllString(match[2], "_"))})
	}
	return result
}

func unicodeTables(resp *response) {
	resp.Version = unicode.Version
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if r >= 0xd800 && r <= 0xdfff {
			continue
		}
		if up := unicode.ToUpper(r); up != r {
			resp.Upper = append(resp.Upper, [2]rune{r, up})
		}
		if unicode.IsSpace(r) {
			resp.Spaces = append(resp.Spaces, r)
		}
	}
}

func main() {
	texts := map[string][]byte{}
	decoder := json.NewDecoder(bufio.NewReader(os.Stdin))
	out := bufio.NewWriter(os.Stdout)
	encoder := json.NewEncoder(out)
	for {
		var req request
		if err := decoder.Decode(&req); err != nil {
			break
		}
		resp := response{}
		text := texts[req.TextID]
		switch req.Op {
		case "load":
			texts[req.ID] = req.Text
		case "device", "device_unscoped", "mdev":
			resp.Results = [][]byte{}
			for _, key := range req.Keys {
				var result string
				switch req.Op {
				case "device":
					result = deviceName(text, string(key))
				case "device_unscoped":
					result = deviceNameUnscoped(text, string(key))
				default:
					result = mdevResource(text, key)
				}
				resp.Results = append(resp.Results, []byte(result))
			}
		case "profiles":
			for _, key := range req.Keys {
				resp.Profiles = append(resp.Profiles, profiles(key))
			}
		case "unicode":
			unicodeTables(&resp)
		default:
			resp.Error = fmt.Sprintf("unknown op %q", req.Op)
		}
		if err := encoder.Encode(resp); err != nil {
			os.Exit(1)
		}
		if err := out.Flush(); err != nil {
			os.Exit(1)
		}
	}
}
