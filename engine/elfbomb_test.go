package engine_test

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// writeELFBomb writes path: a 64-bit little-endian ELF shared object for
// this machine whose section of type big (its dynamic symbols, or their
// versions beside two symbols) is size bytes of zeros, the file sparse
// there. Nothing else in it matters: the deploy's check reads these
// sections before it looks at a symbol.
func writeELFBomb(t *testing.T, path string, big elf.SectionType, size int64) {
	t.Helper()
	machine := elf.EM_X86_64
	if runtime.GOARCH == "arm64" {
		machine = elf.EM_AARCH64
	}
	const ehsize, shentsize, nsec = 64, 64, 5
	dynstr := []byte("\x00")
	shstr := []byte("\x00.dynsym\x00.dynstr\x00.shstrtab\x00.gnu.version\x00")
	dynstrOff := int64(ehsize)
	shstrOff := dynstrOff + int64(len(dynstr))
	shOff := (shstrOff + int64(len(shstr)) + 7) &^ 7
	smallOff := shOff + nsec*shentsize       // the small .dynsym or .gnu.version: zeros
	bigOff := (smallOff + 48 + 4095) &^ 4095 // the big one: a hole
	dynsymOff, dynsymSize, versymOff, versymSize := bigOff, size, smallOff, int64(4)
	if big == elf.SHT_GNU_VERSYM {
		dynsymOff, dynsymSize, versymOff, versymSize = smallOff, 48, bigOff, size
	}
	var b bytes.Buffer
	le := binary.LittleEndian
	hdr := elf.Header64{Type: uint16(elf.ET_DYN), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
		Shoff: uint64(shOff), Ehsize: ehsize, Shentsize: shentsize, Shnum: nsec, Shstrndx: 3}
	copy(hdr.Ident[:], elf.ELFMAG)
	hdr.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	hdr.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	hdr.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	binary.Write(&b, le, hdr)
	b.Write(dynstr)
	b.Write(shstr)
	b.Write(make([]byte, shOff-int64(b.Len())))
	for _, s := range []elf.Section64{
		{},
		{Name: 1, Type: uint32(elf.SHT_DYNSYM), Flags: uint64(elf.SHF_ALLOC), Off: uint64(dynsymOff), Size: uint64(dynsymSize), Link: 2, Info: 1, Addralign: 8, Entsize: 24},
		{Name: 9, Type: uint32(elf.SHT_STRTAB), Flags: uint64(elf.SHF_ALLOC), Off: uint64(dynstrOff), Size: uint64(len(dynstr)), Addralign: 1},
		{Name: 17, Type: uint32(elf.SHT_STRTAB), Off: uint64(shstrOff), Size: uint64(len(shstr)), Addralign: 1},
		{Name: 27, Type: uint32(elf.SHT_GNU_VERSYM), Flags: uint64(elf.SHF_ALLOC), Off: uint64(versymOff), Size: uint64(versymSize), Link: 1, Addralign: 2, Entsize: 2},
	} {
		binary.Write(&b, le, s)
	}
	b.Write(make([]byte, 48))
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, bigOff+size); err != nil {
		t.Fatal(err)
	}
}

// A deploy's static check of the library (checkBundle -> loader.Inspect,
// in the server process) read its dynamic symbols with debug/elf, which
// reads .dynsym whole and makes a 72-byte symbol of every 24-byte entry,
// and reads .gnu.version whole beside them: bounded only by the 4 GiB a
// bundle may unpack to, and zeros compress to nothing. A 29 KB bundle made
// the server allocate 2.6 GiB (a 255 MiB .dynsym) or 1.3 GiB (a 256 MiB
// .gnu.version); such sections are now refused before they are read.
func TestDeployELFCheckBoundsServerMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("packs libraries of 256 MiB")
	}
	for _, c := range []struct {
		section string
		typ     elf.SectionType
	}{{".dynsym", elf.SHT_DYNSYM}, {".gnu.version", elf.SHT_GNU_VERSYM}} {
		t.Run(c.section, func(t *testing.T) {
			m := testkit.Manifest("bomb")
			dir := t.TempDir()
			writeELFBomb(t, filepath.Join(dir, m.Library), c.typ, 24*(256<<20/24))
			testkit.WriteManifest(t, dir, m)
			b, _, _, err := bundle.PackBytes(dir)
			if err != nil {
				t.Fatal(err)
			}
			e := testkit.Engine(t, engine.Config{})
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, err = e.Control().Deploy(context.Background(), m.Name, bytes.NewReader(b), false)
			runtime.ReadMemStats(&after)
			alloc := after.TotalAlloc - before.TotalAlloc
			if err == nil || !strings.Contains(err.Error(), c.section) {
				t.Fatalf("a library with a 256 MiB %s: %v, want it refused naming the section", c.section, err)
			}
			// Spooling, unpacking and hashing stream through fixed
			// buffers (the zstd window included): a valid bundle with
			// 256 MiB of constants allocates about 9 MiB.
			if alloc > 128<<20 {
				t.Errorf("a deploy of %d bytes made the server allocate %d MiB", len(b), alloc>>20)
			}
		})
	}
}
