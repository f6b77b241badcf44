// Opening user input for reading: the one way every reader of a file a user names (safetensors,
// config.json, tokenizer.json, trainer_state.json, token shards, JSON lines, llama2.c files, PEFT
// adapter configs) opens it, so none can block on or misread something that is not a file.
//
// open_input_file opens with O_NONBLOCK, so that opening a FIFO (with no writer) or a device returns
// at once instead of blocking forever, then fstat's the descriptor and refuses anything but a
// regular file before a byte is read; O_NONBLOCK is then cleared (a regular file's reads never
// block anyway). Checking with stat before open would leave a window in which the path is replaced
// by a FIFO; checking the descriptor has none. The size fstat reports is what readers bound their
// allocations by: a count in a header is checked against it before anything is allocated.
// Errors are std::runtime_error "<kind> '<path>': ..." naming the problem and the fix. Host code
// only (g++); no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pv {

// An open regular file, closed when this goes out of scope.
class InputFile {
  public:
    InputFile() = default;
    InputFile(int fd, uint64_t size, std::string path, std::string kind);
    InputFile(InputFile&& o) noexcept;
    InputFile& operator=(InputFile&& o) noexcept;
    InputFile(const InputFile&) = delete;
    InputFile& operator=(const InputFile&) = delete;
    ~InputFile();

    int fd() const { return fd_; }
    uint64_t size() const { return size_; }  // at open (fstat)
    const std::string& path() const { return path_; }
    const std::string& kind() const { return kind_; }

    // Reads exactly n bytes at the current position (read) or at `offset` (pread); a file that
    // ends first is an error saying it shrank while being read.
    void read_exact(void* data, size_t n) const;
    void pread_exact(void* data, size_t n, uint64_t offset) const;
    // The whole file as bytes (for JSON and other small files).
    std::string read_all() const;
    // Hands the descriptor over to the caller (who closes it); this object is then empty.
    int release();

  private:
    int fd_ = -1;
    uint64_t size_ = 0;
    std::string path_, kind_;
};

// Opens `path` for reading if it is a regular file. `kind` names what the file is for the
// messages ("token shard", "config.json"); `hint` is appended to the "cannot open" message (what
// the file should be and where it comes from).
InputFile open_input_file(const std::string& path, const std::string& kind, const std::string& hint = "");

// open_input_file, refusing a file larger than max_bytes (a JSON file that big is not the file it
// should be), then read_all.
std::string read_input_file(const std::string& path, const std::string& kind, uint64_t max_bytes,
                            const std::string& hint = "");

// Whether the optional file `path` is there to read: false when nothing has that name; true for a
// regular file (or a link to one); anything else there (a device, a directory, a FIFO, a dangling
// symbolic link) throws "<kind> '<path>': is ..., not a regular file" — never taken for "no file".
bool optional_input_file(const std::string& path, const std::string& kind);

// The bound on JSON files the readers load whole (config.json, tokenizer.json, trainer_state.json,
// adapter_config.json): far above any real one (Llama 3's tokenizer.json is 9 MB).
inline constexpr uint64_t kMaxJsonFileBytes = uint64_t(1) << 30;

}  // namespace pv
