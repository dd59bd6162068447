fn main() {
    std::process::exit(mqlab::cli::main());
}
