// An independent reader of a C2SP tlog-tiles log, built only on Go's
// golang.org/x/mod/sumdb/note and sumdb/tlog (Debian: golang-golang-x-mod-dev).
// It shares no code with the gateway: it fetches <prefix>/checkpoint, opens it
// with the pinned log key, reads tiles through tlog.TileHashReader (which
// authenticates every tile against the checkpoint's root), recomputes the
// tree hash, proves leaf <index> from the tiles and checks it against the
// leaf's entry in its entry bundle, and proves the checkpoint consistent with
// an older size. Prints one JSON line; exits 1 with the reason on stderr.
//
//	go run main.go <prefix URL> <log vkey> <leaf index> <old size>
package main

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

type reader struct{ prefix string }

func (r reader) Height() int { return 8 }

// tlog-tiles drops sumdb's height element: tile/8/0/x001/234 is tile/0/x001/234,
// and tile/8/data/... is tile/entries/...
func (r reader) path(t tlog.Tile) string {
	p := strings.TrimPrefix(t.Path(), "tile/8/")
	if strings.HasPrefix(p, "data/") {
		p = "entries/" + strings.TrimPrefix(p, "data/")
	}
	return r.prefix + "/tile/" + p
}

func get(url string) ([]byte, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	return body, nil
}

func (r reader) ReadTiles(tiles []tlog.Tile) ([][]byte, error) {
	out := make([][]byte, len(tiles))
	for i, t := range tiles {
		data, err := get(r.path(t))
		if err != nil {
			return nil, err
		}
		out[i] = data
	}
	return out, nil
}

func (r reader) SaveTiles(tiles []tlog.Tile, data [][]byte) {}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 5 {
		fail("usage: main <prefix URL> <log vkey> <leaf index> <old size>")
	}
	prefix, vkey := strings.TrimRight(os.Args[1], "/"), os.Args[2]
	index, _ := strconv.ParseInt(os.Args[3], 10, 64)
	old, _ := strconv.ParseInt(os.Args[4], 10, 64)
	verifier, err := note.NewVerifier(vkey)
	if err != nil {
		fail("log key: %v", err)
	}
	raw, err := get(prefix + "/checkpoint")
	if err != nil {
		fail("checkpoint: %v", err)
	}
	n, err := note.Open(raw, note.VerifierList(verifier))
	if err != nil {
		fail("checkpoint does not verify: %v", err)
	}
	lines := strings.Split(n.Text, "\n")
	if len(lines) < 4 || lines[0] != verifier.Name() {
		fail("checkpoint is not from log %s", verifier.Name())
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil {
		fail("checkpoint size: %v", err)
	}
	rootRaw, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(rootRaw) != tlog.HashSize {
		fail("checkpoint root hash is not 32 bytes of base64")
	}
	var root tlog.Hash
	copy(root[:], rootRaw)
	tree := tlog.Tree{N: size, Hash: root}
	r := reader{prefix}
	hashes := tlog.TileHashReader(tree, r)
	th, err := tlog.TreeHash(size, hashes)
	if err != nil || th != root {
		fail("the tiles do not hash to the checkpoint's root: %v", err)
	}
	proof, err := tlog.ProveRecord(size, index, hashes)
	if err != nil {
		fail("inclusion proof from tiles: %v", err)
	}
	// The leaf's entry, from its entry bundle (uint16 length-prefixed entries).
	bundleTile := tlog.TileForIndex(8, tlog.StoredHashIndex(0, index))
	bundleTile.L = -1
	if end := size - bundleTile.N*256; end < 256 {
		bundleTile.W = int(end)
	}
	bundle, err := get(r.path(bundleTile))
	if err != nil {
		fail("entry bundle: %v", err)
	}
	var entry []byte
	for i, at := int64(0), 0; at < len(bundle); i++ {
		length := int(binary.BigEndian.Uint16(bundle[at:]))
		if i == index%256 {
			entry = bundle[at+2 : at+2+length]
		}
		at += 2 + length
	}
	if entry == nil {
		fail("leaf %d is not in its entry bundle", index)
	}
	if err := tlog.CheckRecord(proof, size, root, index, tlog.RecordHash(entry)); err != nil {
		fail("inclusion proof does not verify: %v", err)
	}
	oldHash, err := tlog.TreeHash(old, hashes)
	if err != nil {
		fail("old tree hash: %v", err)
	}
	consistency, err := tlog.ProveTree(size, old, hashes)
	if err != nil {
		fail("consistency proof from tiles: %v", err)
	}
	if err := tlog.CheckTree(consistency, size, root, old, oldHash); err != nil {
		fail("consistency proof does not verify: %v", err)
	}
	out, _ := json.Marshal(map[string]interface{}{
		"origin": verifier.Name(), "size": size, "root": root.String(), "leaf_index": index,
		"entry": base64.StdEncoding.EncodeToString(entry), "old_size": old, "old_root": oldHash.String(),
		"inclusion_proof": len(proof), "consistency_proof": len(consistency),
	})
	fmt.Println(string(out))
}
