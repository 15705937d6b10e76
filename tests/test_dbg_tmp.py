from tests.test_serve_cancel_contracts import _settled_work, _grpc_and_leave, _post_and_leave, QUESTION, LONG
def test_dbg(serve_stack, serve_engine):
    for kind, db in (("grpc", "dog_kennels"), ("rest", "student_transcripts_tracking"), ("rest", "real_estate_properties"), ("grpc", "cre_Doc_Template_Mgt"), ("rest", "orchestra")):
        before = _settled_work(serve_engine)
        if kind == "rest":
            _post_and_leave(serve_stack.http_url, "/v1/complete", {"db": db, "question": QUESTION, "max_new_tokens": LONG})
        else:
            _grpc_and_leave(serve_stack, db)
        print("DBG", kind, db, _settled_work(serve_engine) - before, flush=True)
