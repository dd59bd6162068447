// Turns the pages' ```mermaid blocks into diagrams. mermaid.min.js (from the
// `mermaid` npm package, which mermaid-cli brings) is copied beside this file
// by `just docs` and by the book test; it is not part of the repository.
document.querySelectorAll("code.language-mermaid").forEach((code) => {
  const div = document.createElement("div");
  div.className = "mermaid";
  div.textContent = code.textContent;
  code.parentElement.replaceWith(div);
});
if (typeof mermaid !== "undefined") {
  mermaid.initialize({ startOnLoad: false, securityLevel: "strict" });
  mermaid.run();
}
